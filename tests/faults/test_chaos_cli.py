"""`waferrt chaos` on the tiny model: a seeded sample of the campaign (benchmarks/chaos.py runs 200+ faults),
and on a (tiny) GGUF file, the path SmolLM2 takes.

Every fault that fired is detected and recovered from (a straggler is never taken for dead; one that fires
near the end may go unnoticed: it only slows the decode), the tokens equal the fault-free run's, and the exit
status says so; the report names the command that reproduces it and the plan it saved is the one that ran
(the same seed draws the same plan: tests/unit/test_faults_model.py).
"""

from __future__ import annotations

import json

from waferrt.cli import main
from waferrt.faults import FaultPlan

ARGS = ["chaos", "--model", "tiny", "--faults", "8", "--seed", "11", "--kinds", "core,link,corrupt,straggler,tile",
        "--max-new-tokens", "10", "--requests", "3", "--json"]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_seeded_campaign_recovers_every_fault_and_saves_its_plan(ray_session, capsys, tmp_path):
    saved = tmp_path / "plan.yaml"
    assert main([*ARGS, "--save-plan", str(saved)]) == 0
    first = _json(capsys)
    assert first["identical"] and first["error"] is None and first["injected"] == 8
    fired = [f for f in first["faults"] if f["outcome"] != "did not fire"]
    assert fired and all(f["outcome"] == "recovered" for f in fired if f["kind"] != "straggler"), fired
    # a straggler is slow, not dead: spotted by its pace when it lasts long enough, never restarted
    assert all("restarted" not in f["action"] for f in fired if f["kind"] == "straggler"), fired
    assert "--seed 11" in first["again"]
    plan = FaultPlan.load(saved)
    assert plan.seed == 11 and [f["fault"] for f in first["faults"]] == plan.to_dict()["faults"]


def test_a_gguf_model_goes_through_generates_planning_too(ray_session, capsys, tmp_path):
    """--model PATH (a Llama GGUF: here a tiny one written for the test) plans and tokenizes as `waferrt
    generate` does; a fault-free plan is not needed to check that path: one dead core, recovered."""
    import dataclasses

    from ggufs import Vocab, write_gguf

    from waferrt.model import synthetic_llama, tiny_config

    config = dataclasses.replace(tiny_config(), vocab_size=264)
    model = tmp_path / "tiny.gguf"
    write_gguf(model, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    assert main(["chaos", "--model", str(model), "--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--faults",
                 "1", "--kinds", "core", "--seed", "2", "--max-new-tokens", "6", "--requests", "2", "--json"]) == 0
    report = _json(capsys)
    assert report["identical"] and report["error"] is None, report


def test_a_streaming_decode_is_planned_as_generate_plans_it_and_its_region_moves(ray_session, capsys):
    """--streaming (as waferrt generate --streaming) on a mesh with room for a second region: a dead core or
    link in the region moves it (MemoryX follows) and the tokens stay the same."""
    assert main(["chaos", "--model", "tiny", "--streaming", "--mesh", "32x16", "--tile", "16x16", "--kinds",
                 "core,link", "--faults", "2", "--seed", "1", "--max-new-tokens", "8", "--requests", "2",
                 "--json"]) == 0
    report = _json(capsys)
    assert report["identical"] and report["error"] is None, report
    assert "--streaming" in report["again"]
    moved = [f for f in report["faults"] if f["outcome"] == "recovered" and "re-planned" in f["action"]]
    assert moved and all("embed+layers 0-2+head" in f["action"] for f in moved), report["faults"]


def test_the_default_model_on_its_default_mesh_runs(ray_session, capsys, smollm2_cut):
    """`waferrt chaos` with no --model (SmolLM2 on the mesh generate's planning fits it to): the path a new user
    takes first. It once ended in an AttributeError (generate's planning read an option chaos did not have)
    while every --model tiny test passed. A fast variant: one request of 2 tokens, one dead core."""
    smollm2_cut(1)  # skips when SmolLM2 is not installed
    assert main(["chaos", "--faults", "1", "--kinds", "core", "--seed", "5", "--max-new-tokens", "2",
                 "--requests", "1", "--json"]) == 0
    report = _json(capsys)
    assert report["identical"] and report["error"] is None and report["injected"] == 1, report
    assert "--model smollm2" in report["again"], report
