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


def resident(mesh, faults=()):
    """Three resident steps of the mesh kernels on a local Wafer of `mesh` cores: losses, weights, recoveries."""
    from waferrt.core.spec import spec_by_name
    from waferrt.runtime import Wafer
    from waferrt.training.mesh import phases_of
    from waferrt.training.resident import ResidentTraining

    config = tiny_config()
    weights, rng = synthetic_llama(config, seed=5), np.random.default_rng(3)
    with Wafer(spec_by_name("wse2"), mesh=mesh, tile=mesh, backend="local") as wafer:
        training = ResidentTraining(config, weights, AdamW(lr=1e-2), phases_of("mesh", wafer), wafer, faults)
        losses = [training.step(rng.integers(0, config.vocab_size, (2, 9)), step).loss for step in range(1, 4)]
        return losses, named_arrays(training.weights()), training.recoveries


@pytest.mark.parametrize("mesh, faults, causes", [
    ((8, 4), ("core:2:1,2",), ["step 2: core (x=1, y=2) died", "re-planned onto the 4x4 square at (2, 0)"]),
    ((20, 8), ("core:1:7,7", "core:3:2,0", "corrupt:3:1"),
     ["step 1: core (x=7, y=7) died", "onto the 8x8 square at (8, 0)", "step 3: core (x=10, y=0) died",
      "onto the 8x8 square at (11, 0)", "step 3: layer 1's gradients of step 3 arrived corrupted"]),
])
def test_a_dead_core_moves_the_square_and_the_weights_stay_the_fault_free_runs(mesh, faults, causes):
    clean = resident(mesh)
    losses, weights, recoveries = resident(mesh, [TrainingFault.parse(f) for f in faults])
    assert all(any(c in r for r in recoveries) for c in causes), recoveries
    assert len(recoveries) == len(faults) and losses == clean[0]
    for name, a in clean[1].items():
        assert np.array_equal(weights[name], a), name


def test_a_dead_core_with_no_spare_square_left_ends_the_run_naming_the_dead():
    from waferrt.training.faults import TrainingFailed

    with pytest.raises(TrainingFailed, match=r"step 2: no square of 4 cores a side is left.*\(x=1, y=0\)"):
        resident((5, 4), [TrainingFault.parse("core:2:1,0")])


@pytest.mark.parametrize("mesh, seed", [("16x8", 2), ("12x4", 5)])
def test_a_resident_chaos_run_ends_with_the_fault_free_weights(capsys, mesh, seed):
    from waferrt.cli import main

    argv = ["train", "--steps", "3", "--batch", "1", "--seq", "8", "--mesh", mesh, "--chaos", "3", "--seed",
            str(seed), "--spec", "wse3", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.splitlines()[-1])
    assert sum(len(s["recoveries"]) for s in out["steps"]) == 3
    assert out["steps"][-1]["identical_to_fault_free"] is True
    assert "weights identical to the fault-free run's: yes" in captured.err


def test_a_streaming_chaos_run_with_dead_cores_ends_with_the_fault_free_weights(ray_session, capsys):
    from waferrt.cli import main

    argv = ["train", "--steps", "3", "--batch", "1", "--seq", "8", "--streaming", "--on", "mesh", "--mesh", "16x8",
            "--chaos", "2", "--seed", "3", "--fault", "core:2:1,1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    recoveries = [r for s in out["steps"] for r in s["recoveries"]]
    assert len(recoveries) == 3 and any("core (x=1, y=1) is dead" in r and "re-planned onto" in r
                                        for r in recoveries), recoveries
    assert out["steps"][-1]["identical_to_fault_free"] is True
