"""A whole Llama block's backward as one composed mesh kernel (waferrt.training.block) on a Wafer without Ray: on
the tiny model, dx and every weight gradient equal float64 finite differences of the block's forward, and what
it books is its closed form op by op; a block that does not fit in the cores' SRAM is refused naming the core
and the bytes; the tied head's cross-entropy and the embedding's scatter-add (waferrt.training.head) likewise,
and book theirs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.gemm_cost import GemmShape
from waferrt.core.spec import TINY
from waferrt.core.train_cost import TrainShape, block_backward_parts, grad_costs, head_backward_parts
from waferrt.decode.decoding import ELEMENTWISE_FLOPS
from waferrt.fabric.misuse import BlockTooLarge
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.reference import rmsnorm
from waferrt.runtime import Wafer
from waferrt.training.block import WEIGHTS, block_backward, block_forward, finite_difference
from waferrt.training.head import embedding_backward, head_backward

CONFIG = tiny_config()
LAYER = synthetic_llama(CONFIG, seed=0).layers[0]
T = 8


@pytest.fixture(scope="module", params=[(T,), (2, T // 2)], ids=["one-sequence", "two-sequences"])
def gradients(request):
    rng = np.random.default_rng(5)
    x, dy = (rng.standard_normal((*request.param, CONFIG.dim)).astype(np.float32) for _ in range(2))
    _, saved = block_forward(CONFIG, LAYER, x)
    with Wafer(spec="tiny", mesh=(8, 8), tile=(4, 4), backend="local") as wafer:
        dx, grads = block_backward(wafer, CONFIG, LAYER, saved, dy)
        report = wafer.cost()
    return x, dy, dict(grads, x=dx), report


@pytest.mark.parametrize("name", WEIGHTS + ("x",))
def test_each_gradient_equals_finite_differences(gradients, name):
    x, dy, grads, _ = gradients
    want_shape = x.shape if name == "x" else getattr(LAYER, name).shape
    assert grads[name].shape == want_shape and grads[name].dtype == np.float32
    u = np.random.default_rng(len(name)).standard_normal(want_shape)
    fd = finite_difference(CONFIG, LAYER, x, dy, name, u)
    np.testing.assert_allclose((grads[name] * u).sum(), fd, rtol=1e-4)


def test_the_kernel_books_each_ops_closed_form(gradients):
    x, *_, report = gradients
    batch = TrainShape(x.size // (x.shape[-2] * CONFIG.dim), x.shape[-2])  # attention per sequence
    want = block_backward_parts(TINY, CONFIG, batch, 8, ELEMENTWISE_FLOPS["softmax"])
    _same(report.by_op, want)


def _same(got: dict, want: dict) -> None:
    """Booked costs by op equal closed forms: the same sums in another order, so the cycles to rounding."""
    assert set(got) == set(want)
    for op, cost in got.items():
        assert dataclasses.replace(cost, cycles=0) == dataclasses.replace(want[op], cycles=0), op
        assert cost.cycles == pytest.approx(want[op].cycles, rel=1e-12), op


def test_a_block_too_large_for_the_cores_is_refused_naming_the_core_and_bytes():
    x = np.zeros((T, CONFIG.dim), np.float32)
    _, saved = block_forward(CONFIG, LAYER, x)
    with Wafer(spec="tiny", mesh=(2, 2), tile=(2, 2), backend="local") as wafer:
        with pytest.raises(BlockTooLarge, match=r"core \(x=0, y=0\).*bytes of weights and activations.*16,384"):
            block_backward(wafer, CONFIG, LAYER, saved, x)


def _head_loss(x, final_norm, embed, targets) -> float:
    logits = rmsnorm(x, final_norm, CONFIG.norm_eps) @ embed.T  # (T, vocab), float64
    top = logits.max(-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    return float((lse - logits[np.arange(len(targets)), targets]).mean())


def test_the_head_and_the_embedding_equal_finite_differences():
    rng = np.random.default_rng(9)
    weights = synthetic_llama(CONFIG, seed=0)
    x = rng.standard_normal((2, T // 2, CONFIG.dim)).astype(np.float32)  # two sequences
    targets, ids = rng.integers(0, CONFIG.vocab_size, (2, T // 2)), rng.integers(0, CONFIG.vocab_size, (2, T // 2))
    with Wafer(spec="tiny", mesh=(8, 8), tile=(4, 4), backend="local") as wafer:
        loss, dx, grads = head_backward(wafer, CONFIG, weights, x, targets)
        demb = embedding_backward(wafer, CONFIG, ids, x)
        with pytest.raises(ValueError, match="7 targets for 8 tokens"):
            head_backward(wafer, CONFIG, weights, x, targets.ravel()[:7])
        head_cost, embed_cost = wafer.cost().per_step
    shape = GemmShape(T, CONFIG.vocab_size, CONFIG.dim, 8, 8)  # (tokens, vocab, dim) on 8x8 cores
    _same(head_cost, head_backward_parts(TINY, shape))
    _same(embed_cost, {"embedding_backward": grad_costs(TINY, shape)[1]})
    assert dx.shape == x.shape
    x, dx, targets, ids = x.reshape(T, -1), dx.reshape(T, -1), targets.ravel(), ids.ravel()
    args = {"x": x, "final_norm": weights.final_norm, "embed": weights.head}
    args64 = {n: a.astype(np.float64) for n, a in args.items()}
    assert loss == pytest.approx(_head_loss(**args64, targets=targets), rel=1e-5)
    for name, got in (("x", dx), ("final_norm", grads["final_norm"]), ("embed", grads["embed"])):
        u, eps = np.random.default_rng(len(name)).standard_normal(args[name].shape), 1e-6
        fd = (_head_loss(**(args64 | {name: args64[name] + eps * u}), targets=targets)
              - _head_loss(**(args64 | {name: args64[name] - eps * u}), targets=targets)) / (2 * eps)
        np.testing.assert_allclose((got * u).sum(), fd, rtol=1e-4, err_msg=name)
    want = np.zeros((CONFIG.vocab_size, CONFIG.dim), np.float32)
    np.add.at(want, ids, x)  # the scatter-add of each token's gradient into its row
    np.testing.assert_allclose(demb, want, rtol=1e-5, atol=1e-6)
