"""The tied head's backward in chunks of the vocabulary (waferrt.training.head_chunks) on a Wafer without Ray: on
the tiny model, with several chunk counts and squares, the loss, dx and the gradients equal the unchunked
kernel's (1e-5) and the numpy reference's (model.backward.head_loss, 1e-4); what the jobs book is
core.train_cost.head_backward_parts(chunks=) op by op; a core's bytes are head_core_bytes' (a byte less of
SRAM is refused, naming the core), and head_chunks picks the fewest chunks that fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.gemm_cost import GemmShape
from waferrt.core.spec import spec_by_name
from waferrt.core.train_cost import head_backward_parts, head_chunks, head_core_bytes
from waferrt.fabric.misuse import BlockTooLarge
from waferrt.model import backward, synthetic_llama, tiny_config
from waferrt.runtime import Wafer
from waferrt.training.head import head_backward

CONFIG = tiny_config()
WEIGHTS = synthetic_llama(CONFIG, seed=0)
T = 8


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, T // 2, CONFIG.dim)).astype(np.float32)  # two sequences
    return x, rng.integers(0, CONFIG.vocab_size, (2, T // 2))


def _run(spec, side: int, chunks: int, seed: int = 0):
    x, targets = _inputs(seed)
    with Wafer(spec=spec.name, mesh=(side, side), tile=(4, 4), backend="local") as wafer:
        wafer.spec = spec  # a smaller SRAM for the bytes' tie (the Wafer's own spec, read by run_job)
        got = head_backward(wafer, CONFIG, WEIGHTS, x, targets, chunks=chunks)
        return got, wafer.cost().by_op


def _close(got, want, rtol: float) -> None:
    (loss, dx, grads), (wloss, wdx, wnorm, whead) = got, want
    assert loss == pytest.approx(wloss, rel=rtol)
    for a, b in ((dx, wdx), (grads["final_norm"], wnorm), (grads["embed"], whead)):
        assert a.shape == b.shape and a.dtype == np.float32
        assert np.abs(a - b).max() <= rtol * np.abs(b).max()


@pytest.mark.parametrize("spec,side", [("tiny", 8), ("wse2", 4)])
@pytest.mark.parametrize("chunks", [2, 3, 5, 16])
def test_chunked_gradients_equal_the_unchunked_kernels_and_the_references(spec, side, chunks):
    spec = spec_by_name(spec)
    got, booked = _run(spec, side, chunks)
    whole, _ = _run(spec, side, 1)
    x, targets = _inputs(0)
    _close(got, (whole[0], whole[1], whole[2]["final_norm"], whole[2]["embed"]), 1e-5)
    _close(got, backward.head_loss(x, WEIGHTS.final_norm, WEIGHTS.head, targets, CONFIG), 1e-4)
    want = head_backward_parts(spec, GemmShape(T, CONFIG.vocab_size, CONFIG.dim, side, side), chunks=chunks)
    assert set(booked) == set(want)
    for op, cost in booked.items():
        assert dataclasses.replace(cost, cycles=0) == dataclasses.replace(want[op], cycles=0), op
        assert cost.cycles == pytest.approx(want[op].cycles, rel=1e-12), op


@pytest.mark.parametrize("chunks", [1, 3])
def test_a_cores_bytes_are_head_core_bytes(chunks):
    shape = GemmShape(T, CONFIG.vocab_size, CONFIG.dim, 4, 4)
    need = head_core_bytes(shape, chunks)
    tight = spec_by_name("tiny").replace(sram_bytes=need)
    _run(tight, 4, chunks)  # fits to the byte
    with pytest.raises(BlockTooLarge, match=r"core \(x=0, y=0\)"):
        _run(tight.replace(sram_bytes=need - 1), 4, chunks)
    assert head_chunks(tight, shape) <= chunks
    assert head_chunks(tight.replace(sram_bytes=need - 1), shape) > chunks


def test_the_default_is_the_fewest_chunks_that_fit():
    spec, shape = spec_by_name("tiny"), GemmShape(T, CONFIG.vocab_size, CONFIG.dim, 4, 4)
    small = spec.replace(sram_bytes=head_core_bytes(shape, 4))
    assert head_chunks(small, shape) == min(n for n in range(1, 257) if head_core_bytes(shape, n) <= small.sram_bytes)
    assert head_chunks(spec.replace(sram_bytes=1 << 20), shape) == 1
    with pytest.raises(ValueError, match="even one word a core"):
        head_chunks(spec.replace(sram_bytes=64), shape)
    (_, _, grads), booked = _run(small, 4, None)
    assert "head_stats" in booked and grads["embed"].shape == WEIGHTS.head.shape
