"""Weight-streaming training on Ray (actors/training.py): the weights and AdamW's state in the MemoryX actor,
the step on the streaming region's tile. After N steps its weights equal the resident run's bit for bit, its
gradients are the reference's (tiny and SmolLM2), and a GGUF saved by `waferrt train` decodes on the wafer as
on the reference."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from waferrt.actors.training import StreamingTraining
from waferrt.cli import main
from waferrt.core.train_cost import TrainShape
from waferrt.model import load_model, smollm2_path, synthetic_llama, tiny_config
from waferrt.model.backward import loss_and_grads, named_arrays
from waferrt.training.adamw import AdamW
from waferrt.training.cost import step_stream_bytes
from waferrt.training.step import train_step
from waferrt.training.store import ParamStore

WAFER = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "48", "--requests", "1"]


def batches(config, n: int, batch: int, seq: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, config.vocab_size, (batch, seq + 1)) for _ in range(n)]


@pytest.mark.parametrize("tied", [True, False])
def test_streaming_weights_equal_the_resident_runs_bit_for_bit(ray_session, tied):
    config = dataclasses.replace(tiny_config(), tie_embeddings=tied)
    weights, hp = synthetic_llama(config, seed=2), AdamW(lr=1e-2)
    resident = ParamStore(config, weights, hp)
    with StreamingTraining(config, weights, hp) as streaming:
        for step, toks in enumerate(batches(config, 4, 2, 16), start=1):
            want = train_step(resident, toks, step)
            got = streaming.step(toks, step)
            assert got == want  # the same loss, the same bytes in and out
        assert (got.bytes_in, got.bytes_out) == step_stream_bytes(config, TrainShape(2, 16))
        final = named_arrays(streaming.weights())
    for name, a in named_arrays(resident.weights()).items():
        assert np.array_equal(final[name], a), name


def test_smollm2_streams_two_steps_with_the_references_gradients(ray_session):
    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    config, weights = load_model(path)[:2]
    toks = batches(config, 2, 1, 8)
    with StreamingTraining(config, weights, AdamW()) as streaming:
        losses = [streaming.step(toks[0], 1).loss]
        before = streaming.weights()  # the weights step 2 takes its gradients at: step 1's AdamW update applied
        moved = named_arrays(before)
        assert any(not np.array_equal(moved[name], w) for name, w in named_arrays(weights).items())
        losses.append(streaming.step(toks[1], 2).loss)
        got = streaming.last_grads()
    loss, want = loss_and_grads(config, before, toks[1])
    assert losses[1] == pytest.approx(loss, rel=1e-6) and all(np.isfinite(losses))
    for name, g in want.items():
        np.testing.assert_allclose(got[name], g, rtol=1e-4, atol=1e-4 * np.abs(g).max(), err_msg=name)


def test_a_trained_gguf_decodes_on_the_wafer_as_on_the_reference(ray_session, capsys, tmp_path):
    path = str(tmp_path / "trained.gguf")
    assert main(["train", "--steps", "4", "--batch", "2", "--seq", "32", "--streaming", "--save", path]) == 0
    out = capsys.readouterr().out
    assert "trained 4 steps" in out and "MB in" in out
    argv = ["generate", "the wafer", "--model", path, "--max-new-tokens", "10", "--json"]
    assert main(argv + WAFER) == 0
    wafer = json.loads(capsys.readouterr().out)
    assert main(argv + ["--reference"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert wafer["tokens"] == ref["tokens"] and len(ref["tokens"]) == 10


def test_the_streaming_tile_runs_the_step_as_mesh_kernels(ray_session):
    """--streaming --on mesh: the tile's own Wafer runs each layer's forward and backward and the head's; the
    gradients are the reference's and the tile's ledger holds the resident step_cycles' forward and backward."""
    import functools

    import ray

    from waferrt import Wafer
    from waferrt.core.mesh import Region
    from waferrt.core.spec import WSE2
    from waferrt.training.cost import step_cycles

    config, shape = tiny_config(), TrainShape(2, 8)
    weights, toks = synthetic_llama(config, seed=2), batches(config, 1, 2, 8)[0]
    wafer = functools.partial(Wafer, WSE2, mesh=(8, 8), tile=(8, 8), backend="local")
    with StreamingTraining(config, weights, AdamW(), (), wafer) as streaming:
        streaming.step(toks, 1)
        got, booked = streaming.last_grads(), ray.get(streaming.tile.booked_cycles.remote(), timeout=60)
    for name, g in loss_and_grads(config, weights, toks)[1].items():
        assert np.max(np.abs(got[name] - g)) <= 1e-4 * np.max(np.abs(g)), name
    cycles = step_cycles(WSE2, config, Region(0, 0, 8, 8), shape, streaming=False)
    want = cycles.forward + cycles.backward
    assert booked == pytest.approx(want, rel=1e-12)
