"""`waferrt chaos` on the tiny model: a seeded sample of the campaign (benchmarks/chaos.py runs 200+ faults).

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
