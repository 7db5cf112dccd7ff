"""Faults while the activations are kept on the tiles and the first layers recomputed (waferrt.training.kept,
a core's SRAM cut so that the tiny model's layers 0 and 1 are recomputed): a dead core (as layer 0's
backward starts: its recomputed forward needs the core), a corrupted gradient payload and, under weight
streaming, a tile that dies (its SRAM, the kept activations with it, lost) are each recovered from by redoing
the step from the last good weights, and the weights are the fault-free run's bit for bit."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from waferrt.core.spec import WSE2
from waferrt.core.train_cost import TrainShape
from waferrt.core.train_memory import keep_plan
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.backward import named_arrays
from waferrt.runtime import Wafer
from waferrt.training.adamw import AdamW
from waferrt.training.faults import TrainingFault

TIGHT = WSE2.replace(sram_bytes=6000)
CONFIG, BATCH = tiny_config(), (2, 9)  # 16 tokens a step


def _steps(training) -> list[float]:
    rng = np.random.default_rng(3)
    return [training.step(rng.integers(0, CONFIG.vocab_size, BATCH), step).loss for step in range(1, 4)]


def resident(faults=()):
    from waferrt.training.mesh import phases_of
    from waferrt.training.resident import ResidentTraining

    with Wafer(TIGHT, mesh=(16, 8), tile=(16, 8), backend="local") as wafer:
        training = ResidentTraining(CONFIG, synthetic_llama(CONFIG, seed=5), AdamW(lr=1e-2), phases_of("mesh", wafer),
                                    wafer, faults)
        return _steps(training), named_arrays(training.weights()), training.recoveries


def streaming(faults=()):
    from waferrt.actors.training import StreamingTraining

    wafer = functools.partial(Wafer, TIGHT, mesh=(8, 8), tile=(8, 8), backend="local")
    with StreamingTraining(CONFIG, synthetic_llama(CONFIG, seed=5), AdamW(lr=1e-2), faults, wafer) as training:
        return _steps(training), named_arrays(training.weights()), training.recoveries


def _same(run, clean, causes) -> None:
    losses, weights, recoveries = run
    assert len(recoveries) == len(causes) and all(c in r for c, r in zip(causes, recoveries, strict=True)), recoveries
    assert losses == clean[0]
    for name, a in clean[1].items():
        assert np.array_equal(weights[name], a), name


def test_the_runs_recompute_layers():
    assert keep_plan(TIGHT, CONFIG, TrainShape(2, 8), 8).recomputed == 2


def test_a_dead_core_and_a_corrupt_payload_while_recomputing_end_with_the_fault_free_weights():
    faults = [TrainingFault.parse(f) for f in ("core:2:1,2", "corrupt:3:1")]
    _same(resident(faults), resident(), ["step 2: core (x=1, y=2) died", "step 3: layer 1's gradients"])


@pytest.mark.usefixtures("ray_session")
def test_a_tile_dying_with_the_kept_activations_ends_with_the_fault_free_weights():
    faults = (TrainingFault("tile", 2, 1), TrainingFault("corrupt", 3, 0))
    _same(streaming(faults), streaming(), ["step 2: the tile died", "step 3: layer 0's gradients"])
