"""Writing llama GGUF files: the project's own models (synthetic shapes, cuts, conversions) as llama.cpp reads them.

Contract: ``write_gguf(path, config, weights)`` writes a whole llama GGUF with ``weights`` as F32 tensors
under llama.cpp's names (the names ``gguf_loader`` reads back) and a byte-level BPE vocabulary of
``config.vocab_size`` tokens. Like ``gguf_loader``, this is a model file module: the only other place that
imports ``gguf``; nothing on the pure floors imports it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from waferrt.model import LlamaConfig, LlamaWeights
from waferrt.model.gguf_loader import _LAYER_TENSORS
from waferrt.model.tokenizer import _byte_chars


def write_gguf(
    path: Path, config: LlamaConfig, weights: LlamaWeights, arch: str = "llama", q8_1: str = "",
    merges: tuple[str, ...] = ("Ġ t",), extra_tokens: tuple[str, ...] = (),
) -> None:
    """A llama GGUF holding `weights` as F32 (tensor `q8_1`, if named, as Q8_1 garbage instead). The
    vocabulary is the 256 byte tokens, then `extra_tokens`, padded with unused tokens to vocab_size."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(config.n_layers)
    w.add_context_length(config.max_seq_len)
    w.add_embedding_length(config.dim)
    w.add_feed_forward_length(config.hidden_dim)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    tokens = list(_byte_chars().values()) + list(extra_tokens)
    w.add_token_list(tokens + [f"<unused{i}>" for i in range(config.vocab_size - len(tokens))])
    w.add_token_merges(list(merges))
    w.add_token_types([1] * config.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    tensors = {"token_embd.weight": weights.embed, "output_norm.weight": weights.final_norm}
    if not weights.tied:
        tensors["output.weight"] = weights.head
    for i, layer in enumerate(weights.layers):
        tensors.update({f"blk.{i}.{g}.weight": getattr(layer, f) for f, g in _LAYER_TENSORS.items()})
    for name, a in tensors.items():
        if name == q8_1:
            q8_1_rows = np.zeros((a.shape[0], a.shape[1] // 32 * 40), np.uint8)  # 40 bytes per 32 values
            w.add_tensor(name, q8_1_rows, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
