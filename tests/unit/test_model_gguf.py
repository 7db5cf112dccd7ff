"""load_gguf on small GGUF files written here: layout round trip, untied heads, and the error messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ggufs import write_gguf

from waferrt.model import KVCache, LlamaConfig, ReferenceModel, load_gguf, synthetic_llama

CONFIG = LlamaConfig(
    vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64,
    rope_theta=50000.0, norm_eps=1e-6, max_seq_len=64, tie_embeddings=False,
)  # fmt: skip


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
