"""The activations a training step keeps on the tiles (waferrt.training.kept, core.train_memory): each layer's
forward leaves them in the square's SRAM for its backward (the host neither reads nor puts them), every
layer's at once; the layers that do not fit keep their input and are recomputed (booked as a forward each);
the step's gradients are the host round trip's, bit for bit, whichever layers are recomputed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.cost import total
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.core.train_cost import TrainShape, head_chunks, head_core_bytes
from waferrt.core.train_memory import keep_plan, kept_core_bytes
from waferrt.estimator.train import activation_bytes
from waferrt.estimator.train_layer import Grid, Run, Work, head_parts, layer_parts, pass_cost, recompute_cost
from waferrt.fabric.misuse import BlockTooLarge
from waferrt.model import synthetic_llama, tiny_config
from waferrt.runtime import Wafer
from waferrt.training.block import block_backward
from waferrt.training.cost import head_backward_cycles, layer_forward_cycles, recompute_cycles, step_cycles
from waferrt.training.forward import KEPT, block_forward_mesh
from waferrt.training.mesh import mesh_phases
from waferrt.training.onwafer import Job, check_fits
from waferrt.training.step import train_step
from waferrt.training.store import ParamStore

CONFIG, SHAPE, MESH = tiny_config(), TrainShape(2, 8), (8, 8)
ROOMY, TIGHT = WSE2, WSE2.replace(sram_bytes=6000)  # every layer kept; layers 0 and 1 recomputed
PLANS = {"kept": ROOMY, "recomputed": TIGHT}


class Watch:
    """What the host put into and read from the DSM during a step, and the most a core held as a kernel ran."""

    def __init__(self, wafer):
        self.puts, self.gets, self.peak, self.at_head = [], [], 0, None
        put, get, run = wafer.dsm.put, wafer.dsm.get, wafer.run

        def held() -> int:
            return max(t["max"] for t in wafer.sram())

        def on_put(name, a):
            self.puts.append(name)
            return put(name, a)

        def on_get(name, fill=None):
            self.gets.append(name)
            return get(name, fill)

        def on_run(kernel, **kw):
            self.peak = max(self.peak, held())
            if self.at_head is None and any(n.startswith("hb.") for n in wafer.dsm.layouts):
                self.at_head = {n: wafer.dsm.layouts[n] for n in wafer.dsm.layouts if n.startswith("kept.")}, held()
            return run(kernel, **kw)

        wafer.dsm.put, wafer.dsm.get, wafer.run = on_put, on_get, on_run


def _step(spec, phases=mesh_phases, shape=SHAPE):
    """(the step's gradients, the cycles booked, the Watch) of one step of the tiny model on 8x8 cores."""
    store = ParamStore(CONFIG, synthetic_llama(CONFIG, seed=0))
    tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (shape.batch, shape.seq + 1))
    with Wafer(spec, mesh=MESH, tile=MESH, backend="local") as wafer:
        watch = Watch(wafer)
        train_step(store, tokens, 1, phases(wafer))
        assert not [n for n in wafer.dsm.layouts], "the step left tensors on the square"
        return store.last_grads, wafer.cost().total.cycles, watch


def _host_round_trip(wafer):
    """The phases as they were: the forward's activations read back to the host, put again by the backward."""
    mesh = mesh_phases(wafer)
    return dataclasses.replace(
        mesh, forward=lambda x, layer, rope: block_forward_mesh(wafer, layer.config, layer.weights, x),
        backward=lambda dy, saved, layer, rope: block_backward(wafer, layer.config, layer.weights, saved, dy))


def _plan(spec):
    return keep_plan(spec, CONFIG, SHAPE, min(MESH))


def test_the_plans_keep_all_or_recompute_the_first_layers():
    assert (_plan(ROOMY).kept, _plan(ROOMY).recomputed) == (3, 0)
    assert (_plan(TIGHT).kept, _plan(TIGHT).recomputed) == (1, 2) and _plan(TIGHT).fits
    assert "layers 0..1 keep their input and are recomputed" in str(_plan(TIGHT))


@pytest.mark.parametrize("plan", PLANS)
def test_the_kept_bytes_a_core_holds_are_what_the_dsm_holds(plan):
    """As the head runs, every layer's forward is done: the DSM holds each core the plan's kept bytes (x and
    the activations of the kept layers, x of the recomputed) and the head's job, and at its fullest the plan's
    peak."""
    spec = PLANS[plan]
    _, _, watch = _step(spec)
    kept, at_head = watch.at_head
    p, head = _plan(spec), GemmShape(SHAPE.tokens, CONFIG.vocab_size, CONFIG.dim, *MESH)
    held = kept_core_bytes(CONFIG, SHAPE, min(MESH)).held(p.kept, p.recomputed)
    assert at_head == held + head_core_bytes(head, p.head_chunks)
    assert len(kept) == 11 * p.kept + p.recomputed  # x and forward.KEPT, or x alone
    assert watch.peak == p.peak <= spec.sram_bytes


@pytest.mark.parametrize("plan", PLANS)
def test_the_host_neither_reads_nor_puts_a_kept_activation(plan):
    _, _, watch = _step(PLANS[plan])
    kept = {f"bf.o.{n}" for n in KEPT} | {f"bb.{n}" for n in (*KEPT, "x")}
    assert not kept & set(watch.puts + watch.gets)
    assert [n for n in watch.puts if n.startswith("kept.")] == ["kept.0.x"]  # the embedding rows, streamed in
    assert not [n for n in watch.gets if n.startswith("kept.")]
    assert watch.gets.count("bf.o.y") == 1 and watch.puts.count("bb.dy") == 1  # the head's in and out


def test_recomputing_layers_changes_no_bit_and_books_a_forward_each():
    want, booked_host, _ = _step(ROOMY, _host_round_trip)
    kept, booked_kept, _ = _step(ROOMY)
    redone, booked_redone, _ = _step(TIGHT)
    for name, g in want.items():
        assert np.array_equal(kept[name], g) and np.array_equal(redone[name], g), name
    assert booked_kept == booked_host
    region = Region(0, 0, *MESH)
    closed = recompute_cycles(TIGHT, CONFIG, region, SHAPE)
    assert closed == 2 * layer_forward_cycles(TIGHT, CONFIG, region, SHAPE) > 0
    assert booked_redone - booked_kept == pytest.approx(closed, rel=1e-12)
    cycles = step_cycles(TIGHT, CONFIG, region, SHAPE, streaming=False)
    assert cycles.recompute == closed and booked_redone == pytest.approx(cycles.forward + cycles.backward, rel=1e-12)
    streamed = [step_cycles(spec, CONFIG, region, SHAPE, streaming=True) for spec in (ROOMY, TIGHT)]
    assert 0 <= streamed[1].recompute <= closed  # a recomputed forward may hide under its stage's stream
    assert streamed[1].backward - streamed[0].backward == pytest.approx(streamed[1].recompute, rel=1e-12)


def test_sequences_padded_on_the_square_keep_what_the_plan_counts_and_give_the_host_round_trips_gradients():
    """Three sequences of 5 on 8x8 cores lie as 24 rows (each padded to 8: kernels.sequences): the host's
    crossings go through interleave/deinterleave, the kept step's gradients are the host round trip's bit for
    bit, and the DSM's fullest is the plan's peak (kept bytes of square_tokens rows, not 15 tokens')."""
    shape = TrainShape(3, 5)
    want, _, _ = _step(ROOMY, _host_round_trip, shape)
    got, _, watch = _step(ROOMY, shape=shape)
    for name, g in want.items():
        assert np.array_equal(got[name], g), name
    assert watch.peak == keep_plan(ROOMY, CONFIG, shape, min(MESH)).peak


def test_a_square_too_small_even_recomputing_fails_as_the_step_starts_naming_the_core_and_the_bytes():
    spec = WSE2.replace(sram_bytes=5500)  # the backward job alone fits (4,896 bytes), not with the kept
    assert not _plan(spec).fits and _plan(spec).recomputed == 3
    with pytest.raises(BlockTooLarge, match=r"the training step: core \(x=0, y=0\) \(and every other\) of the 8x8 "
                                            r"square would hold 5,856 bytes at its fullest even with every layer "
                                            r"recomputed \(3 layers keep only their input x\), more than its SRAM "
                                            r"\(5,500 bytes on wse2\)"):
        _step(spec)


def test_a_job_counts_the_bytes_the_step_keeps():
    grid_shape = (8, 8, 2, 8)  # x's blocks: 64 bytes a core
    job = Job("bb.", Region(0, 0, 8, 8), {"dy": np.zeros(grid_shape, np.float32)}, {"d.dx": grid_shape}, print,
              held=5_000)
    check_fits(WSE2.replace(sram_bytes=5_128), job, "a job")
    with pytest.raises(BlockTooLarge, match=r"a job on 8x8 cores: core \(x=0, y=0\).* 64 bytes of weights and "
                                            "activations and 64 bytes of results on top of 5,000 bytes of the layers' "
                                            r"kept activations, more than its SRAM \(5,127 bytes"):
        check_fits(WSE2.replace(sram_bytes=5_127), job, "a job")


@pytest.mark.parametrize("plan", PLANS)
def test_the_estimators_pass_adds_the_steps_recomputation(plan):
    spec, region, shape = PLANS[plan], Region(0, 0, *MESH), TrainShape(1, 16)  # one sequence: the kernels' attention
    work = Work(CONFIG, CONFIG.n_layers, 1, 16, "float32")
    want = recompute_cycles(spec, CONFIG, region, shape)
    run = Run(1, 16, min(MESH))
    assert recompute_cost(spec, work, run, layer_parts(spec, CONFIG, run)).cycles == want == step_cycles(
        spec, CONFIG, region, shape, streaming=False).recompute
    assert (want > 0) == (plan == "recomputed")


@pytest.mark.parametrize("batch", [1, 4])  # 4 x 64 (train's default): the kept layers leave the head less room
def test_the_estimators_head_is_in_the_steps_chunks(batch):
    spec, region, shape = WSE2, Region(0, 0, *MESH), TrainShape(batch, 64)
    work, run = Work(CONFIG, CONFIG.n_layers, batch, 64, "float32"), Run(batch, 64, min(MESH))
    plan = keep_plan(spec, CONFIG, shape, min(MESH))
    alone = head_chunks(spec, GemmShape(shape.tokens, CONFIG.vocab_size, CONFIG.dim, 8, 8))
    assert (plan.head_chunks > alone) == (batch == 4)  # the case where the pass must follow the plan
    head = head_parts(spec, CONFIG, run, plan.head_chunks)
    assert total(c for op, c in head.items() if op != "embedding_backward").cycles == head_backward_cycles(
        spec, CONFIG, region, shape)  # the step's head; the embedding's scatter-add runs off the wafer there
    head = total(head.values())
    layers = total(layer_parts(spec, CONFIG, run).values()).scaled(CONFIG.n_layers)
    recompute = recompute_cost(spec, work, run, layer_parts(spec, CONFIG, run))
    assert pass_cost(spec, work, Grid(8, 8), 8).work.cycles == pytest.approx((layers + head + recompute).cycles)


def test_a_layers_kept_bytes_are_the_estimators_activation_bytes_spread_over_the_square():
    shape, side = TrainShape(1, 64), 8  # blocks without padding
    per, tokens = kept_core_bytes(CONFIG, shape, side), shape.tokens
    assert per.layer * side * side == tokens * activation_bytes(CONFIG, "float32")
    assert per.checkpoint * side * side == tokens * CONFIG.dim * 4
