"""Writing llama GGUF files: the project's own models (synthetic shapes, cuts, conversions) as llama.cpp reads them.

Contract: ``write_model(path, config, weights, tokenizer)`` writes a whole llama GGUF with ``weights`` as F32
tensors under llama.cpp's names (the names ``gguf_loader`` reads back), the config's metadata (an MoE
config's ``expert_count`` / ``expert_used_count`` and expert tensors too) and the given tokenizer (a real
model's, e.g. SmolLM2's for SmolLM2-MoE). ``write_gguf`` is the same with a byte-level BPE vocabulary of
``config.vocab_size`` tokens (tests, synthetic models). Like ``gguf_loader``, this is a model file module:
the only other place that imports ``gguf``; nothing on the pure floors imports it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from waferrt.model import LlamaConfig, LlamaWeights
from waferrt.model.gguf_loader import layer_tensor_names
from waferrt.model.tokenizer import TokenizerMetadata, _byte_chars


def write_gguf(
    path: Path, config: LlamaConfig, weights: LlamaWeights, arch: str = "llama", q8_1: str = "",
    merges: tuple[str, ...] = ("Ġ t",), extra_tokens: tuple[str, ...] = (),
) -> None:
    """A llama GGUF holding `weights` as F32 (tensor `q8_1`, if named, as Q8_1 garbage instead). The
    vocabulary is the 256 byte tokens, then `extra_tokens`, padded with unused tokens to vocab_size."""
    tokens = list(_byte_chars().values()) + list(extra_tokens)
    tokens += [f"<unused{i}>" for i in range(config.vocab_size - len(tokens))]
    tok = TokenizerMetadata(model="gpt2", pre="smollm", tokens=tuple(tokens), merges=tuple(merges),
                            token_types=(1,) * config.vocab_size, bos_id=1, eos_id=2)
    w = gguf.GGUFWriter(path, arch)
    _add_config(w, config)
    _add_tokenizer(w, tok)
    _add_tensors(w, _tensors(config, weights), q8_1)


def write_model(path: Path, config: LlamaConfig, weights: LlamaWeights, tokenizer: TokenizerMetadata) -> None:
    """A llama GGUF holding `weights` as F32 with `tokenizer`'s vocabulary (a model's own)."""
    w = gguf.GGUFWriter(path, "llama")
    _add_config(w, config)
    _add_tokenizer(w, tokenizer)
    _add_tensors(w, _tensors(config, weights), "")


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
