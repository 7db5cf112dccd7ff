"""The emulated training step and its estimate agree (issue 24): on a square of cores of a Wafer without Ray,
what a layer's forward (waferrt.training.forward) and backward (waferrt.training.block), both on the mesh, book is
what estimator.train_layer charges for the same layer on the same square, and a whole step's layers and head
are what the estimator's resident strategy charges for one region -- over two sequences (attention per
sequence on both sides), on the tiny model and on a SmolLM2-shaped block (9 query heads sharing 3 K/V heads),
on squares of 8 and 4; a head too large for a core runs in chunks, as the estimate prices it. The forward on
the mesh equals the host's (block_forward) and books its closed form, one sequence or several."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.cost import Cost, total
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.spec import spec_by_name
from waferrt.core.template import WaferTemplate
from waferrt.core.train_cost import TrainShape, block_forward_parts, head_chunks, head_core_bytes
from waferrt.decode.decoding import ELEMENTWISE_FLOPS
from waferrt.estimator.train import TrainJob, tensor_stream
from waferrt.estimator.train_layer import Grid, Run, Work, head_parts, layer_parts, pass_cost
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.config import LlamaConfig
from waferrt.runtime import Wafer
from waferrt.training.block import block_backward, block_forward
from waferrt.training.forward import block_forward_mesh
from waferrt.training.head import embedding_backward, head_backward

SMOL = LlamaConfig(vocab_size=96, dim=72, n_layers=2, n_heads=9, n_kv_heads=3, hidden_dim=192, max_seq_len=64)
CONFIGS = {"tiny": tiny_config(), "smollm2-shaped": SMOL}
T = 8  # tokens a sequence
B = 2  # sequences a step


def _same(got: Cost, want: Cost) -> None:
    """The same sums in another order: every count equal, the cycles to rounding."""
    assert dataclasses.replace(got, cycles=0) == dataclasses.replace(want, cycles=0)
    assert got.cycles == pytest.approx(want.cycles, rel=1e-12)


def _step(spec, config, side: int) -> tuple[list[Cost], Cost]:
    """The emulated step's booked costs: each layer's forward and backward on the mesh (the backward from the
    activations the forward kept), then the head's and the embedding's."""
    model, rng = synthetic_llama(config, seed=0), np.random.default_rng(side)
    x = rng.standard_normal((B, T, config.dim)).astype(np.float32)
    dy = rng.standard_normal((B, T, config.dim)).astype(np.float32)
    layers = []
    with Wafer(spec=spec.name, mesh=(side, side), tile=(4, 4), backend="local") as wafer:
        for layer in model.layers:
            y, saved = block_forward_mesh(wafer, config, layer, x)
            np.testing.assert_allclose(y, block_forward(config, layer, x)[0], rtol=1e-4, atol=1e-5)
            block_backward(wafer, config, layer, saved, dy)
            layers.append(total(c for step in wafer.cost().per_step[-2:] for c in step.values()))
            x = y
        head_backward(wafer, config, model, x, rng.integers(0, config.vocab_size, (B, T)))
        embedding_backward(wafer, config, rng.integers(0, config.vocab_size, (B, T)), x)
        head = total(c for step in wafer.cost().per_step[-2:] for c in step.values())
    return layers, head


# (model, spec, side): the block must fit the cores' SRAM and leave each core an even share of head_dim
RUNS = [("tiny", "tiny", 8), ("tiny", "wse2", 4), ("smollm2-shaped", "wse2", 4)]


@pytest.fixture(scope="module", params=RUNS, ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}x{p[2]}")
def emulated(request):
    name, spec, side = request.param
    spec = spec_by_name(spec)
    return spec, CONFIGS[name], side, _step(spec, CONFIGS[name], side)


def test_a_layers_forward_and_backward_are_the_estimators_layer(emulated):
    spec, config, side, (layers, _) = emulated
    want = total(layer_parts(spec, config, Run(B, T, side)).values())
    for got in layers:
        _same(got, want)


def test_a_whole_step_is_the_resident_strategys_on_one_region(emulated):
    spec, config, side, (layers, head) = emulated
    work = Work(config, config.n_layers, B, T, "float32")
    kernels = pass_cost(spec, work, Grid(side, side))  # a smaller square's cores could not hold a layer
    _same(total(layers) + head, kernels.work)
    assert (kernels.side, kernels.squares, kernels.grad_sync) == (side, 1, Cost())
    roomy = spec.replace(full_mesh=(side, side), sram_bytes=1 << 24)  # the estimator's memory model holds the
    job = TrainJob(config, TrainShape(B, T), "float32")
    st = tensor_stream(job, WaferTemplate("one square", roomy))  # optimizer's state
    compute, fabric = pass_cost(roomy, work, Grid(side, side)).seconds(roomy, "float32")  # then the optimizer's update
    assert st.fits and st.breakdown.fabric == pytest.approx(fabric, rel=1e-12) and st.breakdown.compute > compute
    assert st.step_s == pytest.approx(st.breakdown.compute + fabric, rel=1e-12)


def test_a_grid_runs_the_fastest_square_whose_cores_hold_a_layer():
    config = CONFIGS["tiny"]
    work, roomy = Work(config, config.n_layers, 16, T, "float32"), spec_by_name("tiny").replace(sram_bytes=1 << 24)
    tried = {s: pass_cost(roomy, work, Grid(16, 8), s) for s in (8, 4, 2, 1)}
    best = pass_cost(roomy, work, Grid(16, 8))
    assert best.cycles == min(c.cycles for c in tried.values())
    assert tried[4].squares == 8 and tried[4].grad_sync.cycles > 0  # 16 sequences, 2 a square, summed over 8
    assert pass_cost(spec_by_name("tiny"), work, Grid(16, 8)).side == 8  # 4x4 cores cannot hold a tiny layer


@pytest.mark.parametrize("spec,side", [("tiny", 8), ("wse2", 4)])
def test_a_head_in_chunks_is_the_estimators_head(spec, side):
    """A core too small for the head's whole table: the emulated head runs in chunks of the vocabulary, and the
    estimate prices those chunks (core.train_cost.head_chunks of the estimator's spec and square)."""
    config, rng = CONFIGS["tiny"], np.random.default_rng(side)
    model = synthetic_llama(config, seed=0)
    shape = GemmShape(B * T, config.vocab_size, config.dim, side, side)
    small = spec_by_name(spec).replace(sram_bytes=head_core_bytes(shape, 2))  # the embedding's fits too
    assert head_chunks(small, shape) > 1
    x = rng.standard_normal((B, T, config.dim)).astype(np.float32)
    with Wafer(spec=spec, mesh=(side, side), tile=(4, 4), backend="local") as wafer:
        wafer.spec = small  # the smaller SRAM (the Wafer's own spec, read by the head's jobs)
        head_backward(wafer, config, model, x, rng.integers(0, config.vocab_size, (B, T)))
        embedding_backward(wafer, config, rng.integers(0, config.vocab_size, (B, T)), x)
        booked = wafer.cost().by_op
    assert "head_stats" in booked  # it ran in chunks
    _same(total(booked.values()), total(head_parts(small, config, Run(B, T, side)).values()))


@pytest.mark.parametrize("shape", [(T,), (2, T // 2), (3, 5)], ids=["one-sequence", "two-sequences", "3x5-padded"])
def test_the_forward_on_the_mesh_is_the_hosts_and_books_its_closed_form(shape):
    config = CONFIGS["tiny"]
    layer = synthetic_llama(config, seed=0).layers[0]
    x = np.random.default_rng(3).standard_normal((*shape, config.dim)).astype(np.float32)
    want_y, want = block_forward(config, layer, x)
    with Wafer(spec="tiny", mesh=(8, 8), tile=(4, 4), backend="local") as wafer:
        y, saved = block_forward_mesh(wafer, config, layer, x)
        booked = wafer.cost().by_op
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    for name in ("x", "h1", "q", "k", "v", "att", "x2", "h2", "gate", "up", "m"):
        np.testing.assert_allclose(getattr(saved, name), getattr(want, name), rtol=1e-4, atol=1e-5, err_msg=name)
    batch = TrainShape(x.size // (shape[-1] * config.dim), shape[-1])  # attention per sequence
    closed = block_forward_parts(spec_by_name("tiny"), config, batch, 8, ELEMENTWISE_FLOPS)
    assert set(booked) == set(closed)
    for op, cost in booked.items():
        _same(cost, closed[op])
