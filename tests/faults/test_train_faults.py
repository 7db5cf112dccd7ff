"""Faults during weight-streaming training (actors/training.py on Ray): a tile that dies mid-step and a
gradient payload corrupted on its way to MemoryX are both seen, the step is redone from the last good weights,
and the weights after N steps are the fault-free run's, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from waferrt.actors.training import StreamingTraining
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.backward import named_arrays
from waferrt.training.adamw import AdamW
from waferrt.training.faults import TrainingFault


def run(faults=()):
    config = tiny_config()
    weights, rng = synthetic_llama(config, seed=5), np.random.default_rng(3)
    with StreamingTraining(config, weights, AdamW(lr=1e-2), faults) as training:
        losses = [training.step(rng.integers(0, config.vocab_size, (2, 17)), step).loss for step in range(1, 5)]
        return losses, named_arrays(training.weights()), training.recoveries


@pytest.fixture(scope="module")
def fault_free(ray_session):
    return run()


@pytest.mark.parametrize("faults, causes", [
    ((TrainingFault("tile", 2, 1),), ["step 2: the tile died"]),
    ((TrainingFault("corrupt", 3, 0, bits=3),), ["step 3: layer 0's gradients of step 3 arrived corrupted"]),
    ((TrainingFault("corrupt", 1, 2), TrainingFault("tile", 1, 0), TrainingFault("tile", 4, 2)),
     ["step 1: layer 2's gradients", "step 1: the tile died", "step 4: the tile died"]),
])
def test_a_faulted_run_ends_with_the_fault_free_weights(fault_free, faults, causes):
    losses, weights, recoveries = run(faults)
    assert len(recoveries) == len(causes) and all(c in r for c, r in zip(causes, recoveries)), recoveries
    assert losses == fault_free[0]
    for name, a in fault_free[1].items():
        assert np.array_equal(weights[name], a), name


@pytest.mark.parametrize("backward", ["reference", "mesh"])
def test_waferrt_train_with_faults_says_its_weights_are_the_fault_free_runs(ray_session, capsys, backward):
    from waferrt.cli import main

    argv = ["train", "--steps", "4", "--batch", "2", "--seq", "16", "--streaming", "--fault", "corrupt:3:2",
            "--fault", "tile:2", "--backward", backward, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])  # (the session Ray's raylet says a worker died)
    assert [len(s["recoveries"]) for s in out["steps"]] == [0, 1, 1, 0]
    assert "the tile died" in out["steps"][1]["recoveries"][0] and "corrupted" in out["steps"][2]["recoveries"][0]
    assert out["steps"][-1]["identical_to_fault_free"] is True
