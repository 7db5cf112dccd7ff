"""The reference's backward pass (waferrt.model.backward) is the derivative of its forward: every weight's
gradient equals central finite differences of the loss (both in float64), on tied and untied models, with
grouped-query attention; the float32 gradients equal the float64 ones; the loss is the forward's own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.model import ReferenceModel, synthetic_llama, tiny_config, tiny_moe_config
from waferrt.model.backward import loss_and_grads, named_arrays
from waferrt.model.weights import LayerWeights, LlamaWeights

SMALL = dataclasses.replace(tiny_config(), vocab_size=40, dim=16, n_layers=2, n_heads=4, n_kv_heads=2,
                            hidden_dim=24)


def as_float64(weights: LlamaWeights) -> LlamaWeights:
    """The same weights in float64 (a tied head stays the embedding itself)."""
    embed = weights.embed.astype(np.float64)
    layers = tuple(LayerWeights(**{f: a.astype(np.float64) for f, a in lw.arrays().items()})
                   for lw in weights.layers)
    head = embed if weights.tied else weights.head.astype(np.float64)
    return LlamaWeights(embed, layers, weights.final_norm.astype(np.float64), head)


def tokens(config, batch: int, seq: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocab_size, (batch, seq + 1))


@pytest.mark.parametrize("tied", [True, False])
def test_every_gradient_is_the_finite_difference_of_the_loss(tied):
    config = dataclasses.replace(SMALL, tie_embeddings=tied)
    weights = as_float64(synthetic_llama(config, seed=3))
    toks = tokens(config, batch=2, seq=5)
    _, grads = loss_and_grads(config, weights, toks)
    rng, eps = np.random.default_rng(1), 1e-6
    for name, w in named_arrays(weights).items():
        for flat in rng.choice(w.size, size=min(6, w.size), replace=False):
            idx = np.unravel_index(flat, w.shape)
            old = w[idx]
            w[idx] = old + eps
            up = loss_and_grads(config, weights, toks)[0]
            w[idx] = old - eps
            down = loss_and_grads(config, weights, toks)[0]
            w[idx] = old
            numeric = (up - down) / (2 * eps)
            assert grads[name][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-9), (name, idx)


def test_the_float32_gradients_are_the_float64_ones():
    config = tiny_config()
    weights = synthetic_llama(config, seed=0)
    toks = tokens(config, batch=2, seq=16)
    loss32, g32 = loss_and_grads(config, weights, toks)
    loss64, g64 = loss_and_grads(config, as_float64(weights), toks)
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    for name, g in g32.items():
        assert g.dtype == np.float32 and g.shape == named_arrays(weights)[name].shape
        np.testing.assert_allclose(g, g64[name], rtol=1e-3, atol=1e-4 * np.abs(g64[name]).max(), err_msg=name)


def test_the_loss_is_the_cross_entropy_of_the_forwards_logits():
    """The training forward is the reference's: the loss at the last position is -log softmax(prefill logits)."""
    config = tiny_config()
    weights = synthetic_llama(config, seed=2)
    toks = tokens(config, batch=1, seq=7, seed=5)
    model = ReferenceModel(config, weights)
    logits = model.prefill(list(toks[0, :-1]), model.new_cache()).astype(np.float64)
    logp = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
    whole = [loss_and_grads(config, weights, toks[:, : s + 2])[0] * (s + 1) for s in (5, 6)]
    assert whole[1] - whole[0] == pytest.approx(-logp[toks[0, -1]], rel=1e-4)


def test_a_mixture_of_experts_is_refused_by_name():
    config = tiny_moe_config()
    with pytest.raises(ValueError, match="mixture of experts.*dense"):
        loss_and_grads(config, synthetic_llama(config), tokens(config, 1, 4))


@pytest.mark.parametrize("bad, match", [(np.zeros((2,), int), "shape"), (np.full((1, 3), 999), "0..255"),
                                        (np.zeros((1, 200), int), "context")])
def test_bad_tokens_are_named(bad, match):
    config = tiny_config()
    with pytest.raises(ValueError, match=match):
        loss_and_grads(config, synthetic_llama(config), bad)
