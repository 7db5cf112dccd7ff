"""The example user suite, examples/fault_suite, runs with plain pytest and passes: here in-process
(pytester) on the session's Ray, with a fixed campaign seed."""

from __future__ import annotations

import pathlib

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_example_fault_suite_passes(ray_session, pytester):
    result = pytester.runpytest_inprocess(str(ROOT / "examples" / "fault_suite"), "--fault-seed", "1",
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["waferrt fault seed: 1 *"])
