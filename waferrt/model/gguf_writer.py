"""Writing llama GGUF files: the project's own models (synthetic shapes, cuts, conversions) as llama.cpp reads them.

Contract: ``write_model(path, config, weights, tokenizer)`` writes a whole llama GGUF with ``weights`` as F32
tensors under llama.cpp's names (the names ``gguf_loader`` reads back), the config's metadata (an MoE
config's ``expert_count`` / ``expert_used_count`` and expert tensors too) and the given tokenizer (a real
model's, e.g. SmolLM2's for SmolLM2-MoE). ``write_gguf`` is the same with a byte-level BPE vocabulary of
``config.vocab_size`` tokens (tests, synthetic models); ``write_tensors(path, config, tensors, dtype)`` the
same from a stream of (name, array) -- ``weights.synthetic_tensors``' -- written as they come (F32 or F16),
so a model of gigabytes is never held whole. Like ``gguf_loader``, this is a model file module: the only
other place that imports ``gguf``; nothing on the pure floors imports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from waferrt.model import LayerWeights, LlamaConfig, LlamaWeights
from waferrt.model.gguf_loader import layer_tensor_names
from waferrt.model.tokenizer import TokenizerMetadata, byte_chars


@dataclass(frozen=True)
class Vocab:
    """The byte-level BPE vocabulary a written GGUF carries besides the 256 byte tokens: its `merges`
    ("a b" pairs) and the `extra_tokens` after the byte tokens."""

    merges: tuple[str, ...] = ("Ġ t",)
    extra_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [m for m in self.merges if len(m.split(" ")) != 2]
        if bad:
            raise ValueError(f"BPE merges are two tokens joined by one space (e.g. 'Ġ t'); got {bad}")


def write_gguf(
    path: Path, config: LlamaConfig, weights: LlamaWeights, arch: str = "llama", q8_1: str = "",
    vocab: Vocab = Vocab(),
) -> None:
    """A llama GGUF holding `weights` as F32 (tensor `q8_1`, if named, as Q8_1 garbage instead). The
    vocabulary is the 256 byte tokens, then `vocab.extra_tokens`, padded with unused tokens to vocab_size."""
    w = gguf.GGUFWriter(path, arch)
    _add_config(w, config)
    _add_tokenizer(w, byte_vocabulary(config, vocab))
    _add_tensors(w, _tensors(config, weights), q8_1)


def write_model(path: Path, config: LlamaConfig, weights: LlamaWeights, tokenizer: TokenizerMetadata) -> None:
    """A llama GGUF holding `weights` as F32 with `tokenizer`'s vocabulary (a model's own)."""
    w = gguf.GGUFWriter(path, "llama")
    _add_config(w, config)
    _add_tokenizer(w, tokenizer)
    _add_tensors(w, _tensors(config, weights), "")


def byte_vocabulary(config: LlamaConfig, vocab: Vocab) -> TokenizerMetadata:
    """A byte-level BPE vocabulary: the 256 byte tokens, then `vocab.extra_tokens`, padded with unused tokens
    to vocab_size."""
    tokens = list(byte_chars().values()) + list(vocab.extra_tokens)
    tokens += [f"<unused{i}>" for i in range(config.vocab_size - len(tokens))]
    return TokenizerMetadata(model="gpt2", pre="smollm", tokens=tuple(tokens), merges=tuple(vocab.merges),
                             token_types=(1,) * config.vocab_size, bos_id=1, eos_id=2)


def _add_config(w: gguf.GGUFWriter, config: LlamaConfig) -> None:
    w.add_block_count(config.n_layers)
    w.add_context_length(config.max_seq_len)
    w.add_embedding_length(config.dim)
    w.add_feed_forward_length(config.hidden_dim)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    if config.moe:
        w.add_expert_count(config.n_experts)
        w.add_expert_used_count(config.top_k)
        if config.shared_hidden_dim:
            w.add_expert_shared_feed_forward_length(config.shared_hidden_dim)


def _add_tokenizer(w: gguf.GGUFWriter, tok: TokenizerMetadata) -> None:
    w.add_tokenizer_model(tok.model)
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(list(tok.tokens))
    w.add_token_merges(list(tok.merges))
    w.add_token_types(list(tok.token_types))
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.eos_id)
    if tok.chat_template is not None:
        w.add_chat_template(tok.chat_template)


def _tensors(config: LlamaConfig, weights: LlamaWeights) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array, every tensor of the model."""
    tensors = {"token_embd.weight": weights.embed, "output_norm.weight": weights.final_norm}
    if not weights.tied:
        tensors["output.weight"] = weights.head
    for i, layer in enumerate(weights.layers):
        tensors.update({f"blk.{i}.{g}.weight": getattr(layer, f) for f, g in layer_tensor_names(config).items()})
    return tensors


def _add_tensors(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], q8_1: str) -> None:
    for name, a in tensors.items():
        if name == q8_1:
            q8_1_rows = np.zeros((a.shape[0], a.shape[1] // 32 * 40), np.uint8)  # 40 bytes per 32 values
            w.add_tensor(name, q8_1_rows, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
        else:
            w.add_tensor(name, np.ascontiguousarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_name(config: LlamaConfig, name: str) -> str:
    """llama.cpp's name of a weight named as ``weights.synthetic_tensors`` names it ("layers[3].wq" ->
    "blk.3.attn_q.weight"; an MoE's w_gate is its shared expert, "ffn_gate_shexp")."""
    if name.startswith("layers["):
        i, field = name[len("layers["):].split("].")
        return f"blk.{int(i)}.{layer_tensor_names(config)[field]}.weight"
    return {"embed": "token_embd.weight", "final_norm": "output_norm.weight", "head": "output.weight"}[name]


def write_tensors(path: Path, config: LlamaConfig, tensors: Iterator[tuple[str, np.ndarray]],
                  dtype: np.dtype = np.dtype(np.float32)) -> None:
    """A llama GGUF of `tensors` -- (name, array) in ``synthetic_tensors``' names and order, every array of
    numpy `dtype` (float32: F32, float16: F16) -- written as they come: one array held at a time."""
    w = gguf.GGUFWriter(path, "llama")
    _add_config(w, config)
    _add_tokenizer(w, byte_vocabulary(config, Vocab(("Ġ t",), ("Ġt",))))  # one merge, so that the BPE has one to make
    for name, shape in _shapes(config).items():
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        w.add_tensor_info(gguf_name(config, name), shape, np.dtype(dtype), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    expected = iter(_shapes(config).items())
    for name, a in tensors:
        want, shape = next(expected)
        if (name, a.shape, a.dtype) != (want, shape, np.dtype(dtype)):
            raise ValueError(f"write_tensors: got {name} {a.shape} {a.dtype}, expected {want} {shape} {dtype} "
                             "(synthetic_tensors' names and order)")
        w.write_tensor_data(np.ascontiguousarray(a))
    w.close()


def _shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, in ``synthetic_tensors``' order."""
    out = {"embed": (config.vocab_size, config.dim)}
    for i in range(config.n_layers):
        out.update({f"layers[{i}].{f}": s for f, s in LayerWeights.shapes(config).items()})
    out["final_norm"] = (config.dim,)
    if not config.tie_embeddings:
        out["head"] = (config.vocab_size, config.dim)
    return out
