"""The training floor: a step's gradients are the reference's, AdamW is the textbook update, the bytes a step
streams are their closed form, the loss falls, the batcher is seeded, the corpus is the project's docs."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

from waferrt.core.cost import flop_cycles
from waferrt.core.mesh import Region
from waferrt.core.spec import spec_by_name
from waferrt.core.train_cost import ADAMW_FLOPS, TrainShape
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.backward import loss_and_grads
from waferrt.training.adamw import AdamW, Moments, adamw_update
from waferrt.training.corpus import Batcher, Corpus, project_text
from waferrt.training.cost import (
    head_backward_cycles,
    layer_backward_cycles,
    layer_forward_cycles,
    resident_core_bytes,
    step_cycles,
    step_stream_bytes,
)
from waferrt.training.faults import MAX_REDOS, CorruptGradient, Run, TrainingFault, corrupt, draw, payload_crc
from waferrt.training.onwafer import squares
from waferrt.training.step import train_step
from waferrt.training.store import ParamStore, Push

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rows(config, batch: int, seq: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocab_size, (batch, seq + 1))


@pytest.mark.parametrize("tied", [True, False])
def test_a_step_applies_the_references_gradients(tied):
    config = dataclasses.replace(tiny_config(), tie_embeddings=tied)
    weights = synthetic_llama(config, seed=1)
    toks = rows(config, 3, 12)
    loss, want = loss_and_grads(config, weights, toks)
    store = ParamStore(config, weights)
    report = train_step(store, toks, 1)
    assert report.loss == pytest.approx(loss, rel=1e-6)
    assert sorted(store.last_grads) == sorted(want)
    for name, g in want.items():
        np.testing.assert_allclose(store.last_grads[name], g, rtol=1e-4, atol=1e-6 * np.abs(g).max(), err_msg=name)
    assert not np.array_equal(store.weights().layers[0].wq, weights.layers[0].wq)  # updated, not in place of
    assert store.weights().tied == tied


@pytest.mark.parametrize("tied, batch, seq", [(True, 2, 8), (False, 3, 5), (True, 1, 17)])
def test_the_bytes_a_step_streams_are_their_closed_form(tied, batch, seq):
    config = dataclasses.replace(tiny_config(), tie_embeddings=tied)
    report = train_step(ParamStore(config, synthetic_llama(config)), rows(config, batch, seq), 1)
    assert (report.bytes_in, report.bytes_out) == step_stream_bytes(config, TrainShape(batch, seq))


def test_adamw_is_the_textbook_update():
    rng = np.random.default_rng(0)
    w0, g1, g2 = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    hp = AdamW(lr=1e-2, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.5)
    w, mom = w0.copy(), Moments.zeros(w0)
    adamw_update(w, g1, mom, 1, hp)
    adamw_update(w, g2, mom, 2, hp)
    ref, m, v = w0.astype(np.float64), 0.0, 0.0
    for t, g in ((1, g1), (2, g2)):
        m, v = 0.8 * m + 0.2 * g, 0.9 * v + 0.1 * g * g
        ref = ref * (1 - 1e-2 * 0.5) - 1e-2 * (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.9 ** t)) + 1e-6)
    np.testing.assert_allclose(w, ref, rtol=1e-5)
    norm = np.ones(4, np.float32)
    adamw_update(norm, np.zeros(4, np.float32), Moments.zeros(norm), 1, hp)
    assert np.array_equal(norm, np.ones(4))  # norm weights are not decayed


class _Counted(np.ndarray):
    """An array that counts the element-wise operations (numpy ufunc calls) it takes part in."""

    ops: list[str] = []

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _Counted.ops.append(ufunc.__name__)
        plain = lambda a: a.view(np.ndarray) if isinstance(a, _Counted) else a  # noqa: E731
        if out is not None:
            kwargs["out"] = tuple(plain(o) for o in out)
        got = getattr(ufunc, method)(*(plain(a) for a in inputs), **kwargs)
        return out[0] if out is not None else np.asarray(got).view(_Counted)


@pytest.mark.parametrize("shape, decayed", [((3, 4), True), ((4,), False)], ids=["matrix", "norm"])
def test_adamw_flops_are_what_adamw_update_runs(shape, decayed):
    """ADAMW_FLOPS (core.train_cost) counts adamw_update's element-wise operations on a matrix; a norm weight,
    not decayed, takes one fewer."""
    w, g = (np.ones(shape, np.float32).view(_Counted) for _ in range(2))
    moments = Moments(*(np.zeros(shape, np.float32).view(_Counted) for _ in range(2)))
    _Counted.ops = []
    adamw_update(w, g, moments, 3, AdamW())
    assert len(_Counted.ops) == ADAMW_FLOPS - (not decayed), _Counted.ops
    assert ADAMW_FLOPS == 3 + 4 + 2 + 1 + 5  # the moments, the bias corrections, the decay, the step


def test_the_loss_falls_over_steps_on_a_fixed_batch():
    config = tiny_config()
    store, toks = ParamStore(config, synthetic_llama(config)), rows(config, 2, 16)
    losses = [train_step(store, toks, t).loss for t in range(1, 9)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_the_batcher_is_seeded_and_windows_the_corpus():
    corpus = Corpus(np.arange(1000))
    a, b = Batcher(corpus, 4, 16, seed=3), Batcher(corpus, 4, 16, seed=3)
    assert np.array_equal(a.rows(7), b.rows(7)) and a.rows(7).shape == (4, 17)
    assert not np.array_equal(a.rows(7), a.rows(8))
    assert np.all(np.diff(a.rows(2), axis=1) == 1)  # consecutive corpus tokens
    with pytest.raises(ValueError, match="smaller --seq"):
        Batcher(Corpus(np.arange(10)), 1, 10)


def test_the_corpus_is_the_projects_docs():
    text = project_text(ROOT)
    assert text.startswith((ROOT / "README.md").read_text()) and "Facts and their owners" in text
    with pytest.raises(FileNotFoundError, match="source checkout"):
        project_text(ROOT / "tests")


def test_streaming_a_step_costs_at_least_its_stream():
    config, shape = tiny_config(), TrainShape(2, 16)
    spec = dataclasses.replace(spec_by_name("tiny"), ingress_bytes_per_s=1e6)  # a slow I/O: stream-bound
    region = Region(0, 0, 8, 8)
    streamed = step_cycles(spec, config, region, shape, streaming=True)
    resident = step_cycles(spec, config, region, shape, streaming=False)
    in_out = sum(step_stream_bytes(config, shape))
    assert streamed.total >= in_out * spec.clock_hz / spec.ingress_bytes_per_s
    assert resident.total < streamed.total and resident.optimizer > 0 == streamed.optimizer


def test_the_training_facts_by_hand():
    """The tiny Llama (vocab 256, dim 64, 3 layers, kv_dim 32, hidden 128): a layer is 64*64*2 + 64*32*2 +
    3*64*128 + 2*64 = 36,992 weights, the model 256*64 + 3*36,992 + 64 = 127,424."""
    config, shape = tiny_config(), TrainShape(4, 64)
    layer, head, rows = 36_992 * 4, (256 + 1) * 64 * 4, 4 * 64 * 64 * 4
    assert step_stream_bytes(config, shape) == (rows + 2 * 3 * layer + head, 3 * layer + head + rows)
    assert step_stream_bytes(config, shape) == (1_019_136, 575_232)
    assert resident_core_bytes(config, Region(0, 0, 16, 16)) == -(-127_424 * 16 // 256) == 7_964
    spec, region = spec_by_name("tiny"), Region(0, 0, 16, 16)
    fwd, bwd = layer_forward_cycles(spec, config, region, shape), layer_backward_cycles(spec, config, region, shape)
    resident = step_cycles(spec, config, region, shape, streaming=False)
    assert resident.forward == 3 * fwd  # booked: test_train_mesh
    assert resident.backward == 3 * bwd + head_backward_cycles(spec, config, region, shape)  # booked: test_train_mesh
    assert resident.optimizer == flop_cycles(spec, -(-ADAMW_FLOPS * 127_424 // 256))


def test_a_corrupted_payload_is_refused_and_a_stale_one_dropped():
    config = tiny_config()
    store = ParamStore(config, synthetic_llama(config))
    toks = rows(config, 1, 8)
    store.begin_step(epoch=1)
    train_step(store, toks, 1, epoch=1)
    grads = {f: store.last_grads[f"layers[0].{f}"] for f in ("wq", "wk")}
    good = payload_crc(grads)
    before = store.params["layers[0].wq"].copy()
    with pytest.raises(CorruptGradient, match="layer 0's gradients of step 2 arrived corrupted"):
        store.push_layer(0, corrupt(grads, 1, seed=0), Push(2, good, epoch=1))
    store.push_layer(0, grads, Push(2, good, epoch=0))  # a dead tile's late push: another attempt's
    assert np.array_equal(store.params["layers[0].wq"], before)
    store.begin_step(epoch=2)
    train_step(store, toks, 2, epoch=2)
    store.rollback()
    assert np.array_equal(store.params["layers[0].wq"], before) and store.last_grads == {}


@pytest.mark.parametrize("text, want", [("tile:2", TrainingFault("tile", 2)),
                                        ("corrupt:3:1", TrainingFault("corrupt", 3, 1)),
                                        ("core:2", TrainingFault("core", 2)),
                                        ("core:4:1,3", TrainingFault("core", 4, core=(1, 3)))])
def test_a_training_fault_reads_from_its_text(text, want):
    assert TrainingFault.parse(text) == want
    assert TrainingFault.parse(str(want)) == want


@pytest.mark.parametrize("steps, layers, kinds, side, n, seed", [
    (4, 2, ("corrupt", "core"), 8, 6, 1), (1, 3, ("tile", "corrupt"), 4, 3, 7), (20, 2, ("core",), 2, 2, 0)])
def test_a_chaos_draw_is_seeded_and_fits_its_run(steps, layers, kinds, side, n, seed):
    run = Run(steps, layers, kinds, side, spares=2)
    faults = draw(n, seed, run)
    assert faults == draw(n, seed, run) and len(faults) == n
    assert {f.kind for f in faults} <= set(kinds)
    assert all(1 <= f.step <= steps and f.layer < layers and max(f.core) < side for f in faults)
    assert max(sum(f.step == s for f in faults) for s in range(1, steps + 1)) <= MAX_REDOS
    assert sum(f.kind == "core" for f in faults) <= 2
    with pytest.raises(ValueError, match="spare squares"):
        draw(3, seed, Run(steps, layers, ("core",), side, spares=2))


@pytest.mark.parametrize("w, h", [(8, 8), (16, 8), (5, 3), (3, 6)])
def test_the_spare_squares_are_every_square_of_the_short_side(w, h):
    found = squares(w, h)
    s = min(w, h)
    assert len(found) == (w - s + 1) * (h - s + 1) and found[0].x0 == found[0].y0 == 0
    assert all(r.w == r.h == s and r.x1 <= w and r.y1 <= h for r in found) and len(set(found)) == len(found)


@pytest.mark.parametrize("text", ["meteor:2", "tile", "tile:0", "tile:x", "corrupt:1:2:3", "core:1:2", "core:1:a,b"])
def test_a_bad_training_fault_names_its_form(text):
    with pytest.raises(ValueError, match="KIND:STEP"):
        TrainingFault.parse(text)
