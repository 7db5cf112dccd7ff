"""load_gguf on small GGUF files written here: layout round trip, untied heads, and the error messages."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from waferrt.model import KVCache, LlamaConfig, LlamaWeights, ReferenceModel, load_gguf, synthetic_llama
from waferrt.model.gguf_loader import _LAYER_TENSORS
from waferrt.model.tokenizer import _byte_chars

CONFIG = LlamaConfig(
    vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64,
    rope_theta=50000.0, norm_eps=1e-6, max_seq_len=64, tie_embeddings=False,
)  # fmt: skip


def write_gguf(
    path: Path, config: LlamaConfig, weights: LlamaWeights, arch: str = "llama", q8_1: str = ""
) -> None:
    """A llama GGUF holding `weights` as F32 (tensor `q8_1`, if named, as Q8_1 garbage instead)."""
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
    w.add_token_list(list(_byte_chars().values()))
    w.add_token_merges(["Ġ t"])
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


def test_round_trip_keeps_layout_and_untied_head(tmp_path: Path) -> None:
    weights = synthetic_llama(CONFIG, seed=3)
    write_gguf(tmp_path / "m.gguf", CONFIG, weights)
    config, loaded, meta = load_gguf(tmp_path / "m.gguf")
    assert config == CONFIG and not loaded.tied and meta.pre == "smollm"
    np.testing.assert_array_equal(loaded.layers[1].wk, weights.layers[1].wk)  # (kv_dim, dim), not transposed
    np.testing.assert_array_equal(loaded.layers[0].w_down, weights.layers[0].w_down)
    np.testing.assert_array_equal(loaded.head, weights.head)
    ids = [5, 6, 7]
    np.testing.assert_array_equal(
        ReferenceModel(config, loaded).prefill(ids, KVCache(config)),
        ReferenceModel(CONFIG, weights).prefill(ids, KVCache(CONFIG)),
    )


def test_other_architectures_are_refused(tmp_path: Path) -> None:
    write_gguf(tmp_path / "g.gguf", CONFIG, synthetic_llama(CONFIG), arch="gpt2")
    with pytest.raises(ValueError, match="'gpt2' model; only the 'llama' architecture"):
        load_gguf(tmp_path / "g.gguf")


def test_unsupported_quant_type_is_named(tmp_path: Path) -> None:
    write_gguf(tmp_path / "q.gguf", CONFIG, synthetic_llama(CONFIG), q8_1="blk.1.ffn_up.weight")
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight .* quantised as Q8_1"):
        load_gguf(tmp_path / "q.gguf")
