"""The pytest plugin's parts that need no wafer (so no Ray): installed as a pytest11 entry point, its
option, markers checked before any fixture runs, seeded plans that a seed replays, and a failing test's
report that says how to replay it. tests/faults runs its wafer fixture and the example suite on Ray."""

from __future__ import annotations

import re
from importlib.metadata import entry_points

pytest_plugins = ["pytester"]

PLANS = """
import json

def test_plans(fault_plan):
    a, b = fault_plan(3, kinds=("core", "link")), fault_plan(2)
    print("PLANS", fault_plan.seed, json.dumps([a.to_dict(), b.to_dict()]))
"""


def test_the_plugin_is_installed_as_a_pytest11_entry_point():
    found = [e.value for e in entry_points(group="pytest11") if e.name == "waferrt"]
    assert found == ["waferrt.testing.plugin"], "reinstall waferrt (pip install -e .) to register the plugin"


def test_a_bad_seed_is_refused_with_what_to_give(pytester):
    bad = pytester.runpytest_inprocess("--fault-seed", "-3")
    assert bad.ret != 0 and "--fault-seed is a whole number >= 0" in bad.stderr.str()


def _plans(result) -> tuple[str, str]:
    seed, plans = re.search(r"PLANS (\d+) (.*)", result.stdout.str()).groups()
    return seed, plans


def test_the_same_seed_draws_the_same_plans_and_another_seed_others(pytester):
    pytester.makepyfile(PLANS)
    first, again, other = (pytester.runpytest_inprocess("-s", "--fault-seed", s) for s in ("7", "7", "8"))
    for r in (first, again, other):
        r.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["waferrt fault seed: 7 (replay with --fault-seed 7)"])
    assert _plans(first) == _plans(again)
    assert _plans(first)[0] != _plans(other)[0] and _plans(first)[1] != _plans(other)[1]
    assert '"kind": "core"' in _plans(first)[1] or '"kind": "link"' in _plans(first)[1]


def test_a_failing_test_that_drew_plans_prints_the_seed_and_the_command_to_replay_it(pytester):
    pytester.makepyfile("def test_campaign(fault_plan):\n    fault_plan(2)\n    assert False\n")
    result = pytester.runpytest_inprocess("--fault-seed", "1234")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "waferrt faults" in out
    assert re.search(r"fault seed 1234; replay with: pytest --fault-seed 1234 'test_\w+.py::test_campaign'", out)


MISUSE = """
import pytest
from waferrt.faults import CoreFailure

@pytest.mark.faults(CoreFailure((3, 4)), at_step=5)
def test_without_the_wafer_fixture():
    pass

@pytest.mark.faults(3)
def test_not_a_fault(wafer):
    pass

@pytest.mark.faults(CoreFailure((3, 4)), at_step=0)
def test_a_bad_step(wafer):
    pass

@pytest.mark.wafer(mesh=(8, 8), tiles=(4, 4))
def test_a_bad_wafer_option(wafer):
    pass
"""


def test_misused_markers_fail_before_any_wafer_opens_and_say_what_to_write(pytester):
    pytester.makepyfile(MISUSE)
    result = pytester.runpytest_inprocess("--setup-show")
    result.assert_outcomes(errors=4)
    out = result.stdout.str()
    assert "Traceback" not in out
    assert "@pytest.mark.faults injects its faults into the `wafer` fixture; add a `wafer` argument" in out
    assert "takes fault values such as waferrt.faults.CoreFailure((3, 4)); got 3 (int)" in out
    assert "at_step=N (N >= 1, the kernel command at which they fire); got at_step=0" in out
    assert ("@pytest.mark.wafer takes keyword arguments ['backend', 'mesh', 'spec', 'tile', 'timeout'], got ['tiles']"
            in out)
    assert "waferrt_ray" not in out and "SETUP    F wafer" not in out  # no Ray, no wafer: caught before
