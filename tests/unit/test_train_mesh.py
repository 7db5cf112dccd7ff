"""A training step whose forward and backward run as mesh kernels (waferrt.training.mesh) on a Wafer without
Ray: its gradients are the numpy reference's (float32, 1e-4 relative), what its kernels book is
``training.cost.step_cycles``' forward and backward, and the modelled time ``waferrt train`` prints is what
they booked plus AdamW's closed form."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from waferrt.cli import main
from waferrt.cli.train import TINY_VOCAB
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.core.train_cost import TrainShape
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.backward import loss_and_grads
from waferrt.runtime import Wafer
from waferrt.training.cost import step_cycles
from waferrt.training.faults import CorruptGradient, corrupt, payload_crc
from waferrt.training.mesh import even_rope_blocks, mesh_phases, mesh_side
from waferrt.training.step import train_step
from waferrt.training.store import ParamStore, Push


def _mesh_step(config, mesh: tuple[int, int], shape: TrainShape, seed: int = 0):
    """(the store after one mesh step, the tokens, the cycles the wafer booked)."""
    store = ParamStore(config, synthetic_llama(config, seed=0))
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (shape.batch, shape.seq + 1))
    with Wafer(WSE2, mesh=mesh, tile=mesh, backend="local") as wafer:
        train_step(store, tokens, 1, mesh_phases(wafer))
        booked = wafer.cost().total.cycles
    return store, tokens, booked


@pytest.mark.parametrize("mesh", [(8, 8), (8, 4)], ids=["8x8", "8x4"])
def test_a_mesh_step_has_the_references_gradients_and_books_step_cycles(mesh):
    config, shape = tiny_config(), TrainShape(2, 8)
    weights = synthetic_llama(config, seed=0)
    store, tokens, booked = _mesh_step(config, mesh, shape)
    want = loss_and_grads(config, weights, tokens)[1]
    for name, g in want.items():
        got = store.last_grads[name]
        assert got.dtype == np.float32 and got.shape == g.shape, name
        assert np.max(np.abs(got - g)) <= 1e-4 * np.max(np.abs(g)), name
    cycles = step_cycles(WSE2, config, Region(0, 0, *mesh), shape, streaming=False)
    assert booked == pytest.approx(cycles.forward + cycles.backward, rel=1e-12)  # every layer's and the head's


def test_the_printed_modelled_time_is_what_the_kernels_booked(capsys):
    assert main(["train", "--steps", "1", "--batch", "2", "--seq", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mesh"] == "8x8" and out["spec"] == "wse2"
    config, shape = dataclasses.replace(tiny_config(), vocab_size=TINY_VOCAB), TrainShape(2, 16)
    booked = _mesh_step(config, (8, 8), shape)[2]
    cycles = step_cycles(WSE2, config, Region(0, 0, 8, 8), shape, streaming=False)
    printed = out["steps"][0]["modelled_s"] * WSE2.clock_hz
    assert printed == pytest.approx(booked + cycles.optimizer, rel=1e-12)  # the ledger's total + AdamW


def test_the_square_keeps_ropes_pairs_whole():
    config = tiny_config()  # head_dim 16
    assert even_rope_blocks(config, Region(0, 0, 8, 8)) and not even_rope_blocks(config, Region(0, 0, 16, 16))
    assert mesh_side(config, Region(0, 0, 16, 12)) == 12 and mesh_side(config, Region(0, 0, 20, 16)) == 15


def test_a_corrupted_mesh_payload_is_caught():
    """The mesh's gradients are read back transposed (Fortran-ordered views): a bit flipped on the wire in
    them still changes the payload (faults.wire.flip flips a C-ordered copy), so MemoryX refuses it."""
    config = tiny_config()
    store, _, _ = _mesh_step(config, (8, 8), TrainShape(1, 8))
    grads = {f: store.last_grads[f"layers[0].{f}"] for f in ("wq", "w_down")}
    grads = {f: np.asfortranarray(g) for f, g in grads.items()}  # as block.matrices gathers them
    bad = corrupt(grads, 1, seed=0)
    assert any(not np.array_equal(bad[f], g) for f, g in grads.items())
    with pytest.raises(CorruptGradient, match="arrived corrupted"):
        store.push_layer(0, bad, Push(2, payload_crc(grads), epoch=0))
