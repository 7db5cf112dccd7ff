"""MoE models as files: llama.cpp's expert tensors and metadata written and read back, cached, converted
(SmolLM2-MoE: the dense FFN cut into experts, `waferrt convert --moe`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from ggufs import write_gguf

from waferrt.cli import main
from waferrt.model import (
    KVCache,
    ReferenceModel,
    load_gguf,
    load_model,
    route,
    synthetic_llama,
    tiny_config,
    tiny_moe_config,
)
from waferrt.model.moe import ExpertCut, cut_into_experts


@pytest.mark.parametrize("shared", [0, 16])
def test_an_moe_gguf_round_trips_with_llama_cpp_names(tmp_path: Path, shared: int) -> None:
    written = tiny_moe_config(n_experts=4, top_k=2, shared_hidden_dim=shared)
    w = synthetic_llama(written, seed=2)
    write_gguf(tmp_path / "moe.gguf", written, w)
    config, loaded, _ = load_gguf(tmp_path / "moe.gguf")
    assert config == written
    for name, a in w.layers[2].arrays().items():
        np.testing.assert_array_equal(getattr(loaded.layers[2], name), a, err_msg=name)
    import gguf

    names = {t.name for t in gguf.GGUFReader(tmp_path / "moe.gguf").tensors}
    assert {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
            "blk.0.ffn_down_exps.weight"} <= names
    assert ("blk.0.ffn_gate_shexp.weight" in names) == bool(shared) and "blk.0.ffn_gate.weight" not in names


def test_the_cache_keeps_the_experts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WAFERRT_CACHE", str(tmp_path / "cache"))
    written = tiny_moe_config(n_experts=4, top_k=1, shared_hidden_dim=8)
    w = synthetic_llama(written, seed=3)
    write_gguf(tmp_path / "moe.gguf", written, w)
    load_model(tmp_path / "moe.gguf")
    config, again, _ = load_model(tmp_path / "moe.gguf")  # from the cache, memory-mapped
    assert config == written and isinstance(again.layers[1].w_down_exps, np.memmap)
    np.testing.assert_array_equal(again.layers[1].w_down_exps, w.layers[1].w_down_exps)
    np.testing.assert_array_equal(again.layers[1].w_gate, w.layers[1].w_gate)


def test_convert_writes_a_moe_the_reference_decodes(tmp_path: Path, capsys) -> None:
    dense_config = dataclasses.replace(tiny_config(), vocab_size=264)
    dense = synthetic_llama(dense_config, seed=4)
    write_gguf(tmp_path / "dense.gguf", dense_config, dense)
    out = tmp_path / "moe.gguf"
    assert main(["convert", "--moe", "4,4", "--router", "zero", "--model", str(tmp_path / "dense.gguf"), str(out)]) == 0
    assert "4 experts of width 32, top-4" in capsys.readouterr().out
    config, w, _ = load_gguf(out)
    ids = [3, 4, 5]
    want = ReferenceModel(dense_config, dense).prefill(ids, KVCache(dense_config))
    np.testing.assert_allclose(ReferenceModel(config, w).prefill(ids, KVCache(config)), want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def smollm2(smollm2_cut):
    """SmolLM2-135M's first 4 layers (enough to tie the cut to the dense FFN, and fast)."""
    return smollm2_cut(4)


def test_smollm2_moe_with_every_expert_and_equal_gates_is_smollm2(smollm2) -> None:
    config, weights = smollm2
    moe_config, w = cut_into_experts(config, weights, ExpertCut(8, 8, seed=None))
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    want = ReferenceModel(config, weights).prefill(ids, KVCache(config))
    got = ReferenceModel(moe_config, w).prefill(ids, KVCache(moe_config))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert int(np.argmax(got)) == int(np.argmax(want))


def test_smollm2_moe_with_a_seeded_router_routes_by_token(smollm2) -> None:
    config, weights = smollm2
    moe_config, w = cut_into_experts(config, weights, ExpertCut(8, 2, seed=0))
    h = np.asarray(weights.embed[[504, 3575, 282, 4649, 314, 9, 17, 2000]])  # (8, dim)
    experts, _ = route(h, w.layers[0].router, moe_config.top_k)
    assert len({tuple(sorted(r)) for r in experts.tolist()}) >= 4
    assert np.isfinite(ReferenceModel(moe_config, w).prefill([504, 3575, 282], KVCache(moe_config))).all()
