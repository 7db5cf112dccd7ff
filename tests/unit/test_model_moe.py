"""The MoE FFN of the numpy reference (Mixtral-style routing, shared expert) on tiny synthetic weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.model import (
    KVCache,
    LayerWeights,
    ReferenceModel,
    Sampler,
    ffn,
    route,
    swiglu,
    synthetic_llama,
    tiny_config,
    tiny_moe_config,
)
from waferrt.model.moe import ExpertCut, cut_into_experts


def test_route_picks_the_top_k_and_gates_sum_to_one() -> None:
    h = np.array([[1, 0], [0, 1], [1, 1]], np.float32)  # (T=3, dim=2)
    router = np.array([[2, 0], [0, 3], [1, 1], [0, 0]], np.float32)  # (E=4, dim)
    experts, gates = route(h, router, 2)
    assert experts.tolist() == [[0, 2], [1, 2], [1, 0]]  # logits rows: [2,0,1,0] [0,3,1,0] [2,3,2,0]
    assert gates.dtype == np.float32
    np.testing.assert_allclose(gates.sum(axis=1), 1, rtol=1e-6)
    e = np.exp(np.float32(1))
    np.testing.assert_allclose(gates[0], [e / (e + 1), 1 / (e + 1)], rtol=1e-6)


@pytest.mark.parametrize("shared", [0, 24])
def test_moe_ffn_is_the_gated_sum_of_the_chosen_experts(shared: int) -> None:
    config = tiny_moe_config(n_experts=4, top_k=2, shared_hidden_dim=shared)
    lw = synthetic_llama(config, seed=3).layers[0]
    h = np.random.default_rng(0).standard_normal((5, config.dim), dtype=np.float32)  # (T, dim)
    out = ffn(h, lw, config)
    assert out.shape == h.shape and out.dtype == np.float32
    logits = h @ lw.router.T  # (T, E)
    for t in range(len(h)):
        top = np.argsort(-logits[t])[:2]
        g = np.exp(logits[t, top] - logits[t, top].max())
        g /= g.sum()
        want = sum(g[j] * swiglu(h[t], lw.w_gate_exps[e], lw.w_up_exps[e], lw.w_down_exps[e])
                   for j, e in enumerate(top))
        if shared:
            want = want + swiglu(h[t], lw.w_gate, lw.w_up, lw.w_down)
        np.testing.assert_allclose(out[t], want, rtol=1e-4, atol=1e-5)


def test_all_experts_with_equal_gates_is_the_dense_ffn_cut_in_pieces() -> None:
    dense_config = tiny_config()
    dense = synthetic_llama(dense_config, seed=4)
    config, w = cut_into_experts(dense_config, dense, ExpertCut(4, 4, seed=None))
    assert (config.n_experts, config.top_k, config.hidden_dim) == (4, 4, 32) and w.layers[0].wq is dense.layers[0].wq
    h = np.random.default_rng(1).standard_normal((3, config.dim), dtype=np.float32)
    np.testing.assert_allclose(ffn(h, w.layers[1], config), ffn(h, dense.layers[1], dense_config), rtol=1e-5, atol=1e-6)
    ids = [5, 6, 7, 8]
    want = ReferenceModel(dense_config, dense).prefill(ids, KVCache(dense_config))
    np.testing.assert_allclose(ReferenceModel(config, w).prefill(ids, KVCache(config)), want, rtol=1e-4, atol=1e-5)


def test_a_seeded_router_with_top_k_below_n_experts_routes_tokens_apart() -> None:
    dense_config = tiny_config()
    config, w = cut_into_experts(dense_config, synthetic_llama(dense_config, seed=4), ExpertCut(4, 2, seed=7))
    h = np.random.default_rng(2).standard_normal((16, config.dim), dtype=np.float32)
    experts, gates = route(h, w.layers[0].router, config.top_k)
    assert len({tuple(sorted(r)) for r in experts.tolist()}) > 2  # tokens choose different pairs
    assert gates.min() < 0.45  # the gates are not all equal
    assert not np.array_equal(w.layers[0].router, w.layers[1].router)


def test_a_cut_refuses_what_cannot_be_cut() -> None:
    with pytest.raises(ValueError, match="do not cut into 5 equal"):
        cut_into_experts(tiny_config(), synthetic_llama(tiny_config()), ExpertCut(5, 2))
    with pytest.raises(ValueError, match="top_k 3 must be 1..n_experts"):
        ExpertCut(2, 3)
    config = tiny_moe_config()
    with pytest.raises(ValueError, match="already is a mixture"):
        cut_into_experts(config, synthetic_llama(config), ExpertCut(2, 1))


def test_moe_model_steps_equal_prefill_and_batch_and_routes_vary() -> None:
    config = tiny_moe_config(n_experts=4, top_k=1, shared_hidden_dim=16)
    w = synthetic_llama(config, seed=5)
    model = ReferenceModel(config, w)
    ids = [3, 17, 99, 4, 250]
    cache = model.new_cache()
    for pos, t in enumerate(ids):
        stepped = model.step(t, pos, cache)
    prefilled = model.prefill(ids, model.new_cache())
    np.testing.assert_allclose(stepped, prefilled, rtol=1e-4, atol=1e-5)
    batched = model.step_batch([ids[0], ids[1]], [0, 0], [model.new_cache(), model.new_cache()])
    np.testing.assert_allclose(batched[0], model.step(ids[0], 0, model.new_cache()), rtol=1e-5, atol=1e-6)
    experts, _ = route(w.embed[ids], w.layers[0].router, 1)
    assert len(set(experts[:, 0].tolist())) > 1  # tokens go to different experts
    assert len(list(model.generate([1, 2, 3], 4, Sampler()))) == 4


def test_config_and_weights_refuse_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="top_k 5 must be 1..n_experts"):
        tiny_moe_config(n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="need n_experts"):
        dataclasses.replace(tiny_config(), top_k=2)
    config = tiny_moe_config()
    w = synthetic_llama(config)
    assert set(LayerWeights.shapes(config)) >= {"router", "w_gate_exps"} and w.layers[0].w_gate is None
    assert config.layer_params(active=True) < config.layer_params()
    assert tiny_config().layer_params(active=True) == tiny_config().layer_params()
    with pytest.raises(ValueError, match="router is missing"):
        ReferenceModel(config, dataclasses.replace(w, layers=(dataclasses.replace(w.layers[0], router=None),
                                                           *w.layers[1:])))
    dense = synthetic_llama(tiny_config())
    with pytest.raises(ValueError, match="w_gate is set but"):
        first = dataclasses.replace(w.layers[0], w_gate=dense.layers[0].w_gate)
        ReferenceModel(config, dataclasses.replace(w, layers=(first, *w.layers[1:])))
