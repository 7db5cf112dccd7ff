"""docs/PROGRAMMING.md teaches by examples that run: every python block of it runs here (on the local wafer),
the fault test as a pytest file with the plugin; and every primitive of the context is in its reference."""

from __future__ import annotations

import pathlib
import re

import pytest

import waferrt

pytest_plugins = ["pytester"]

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "PROGRAMMING.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
SCRIPTS = [b for b in BLOCKS if not b.startswith("# test_")]
TESTS = [b for b in BLOCKS if b.startswith("# test_")]


def test_the_doc_has_a_stencil_a_reduction_and_a_fault_test():
    assert len(SCRIPTS) == 3 and len(TESTS) == 1
    assert all('backend="local"' in s for s in SCRIPTS)


@pytest.mark.parametrize("i", range(len(SCRIPTS)))
def test_a_program_of_the_doc_runs(i, capsys):
    exec(compile(SCRIPTS[i], f"{DOC}:block{i}", "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out  # each prints what it cost


def test_the_fault_test_of_the_doc_passes_without_ray(pytester):
    pytester.makepyfile(test_my_faults=TESTS[0])
    pytester.runpytest_inprocess("--wafer-backend", "local", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_every_public_member_of_the_context_is_in_the_reference():
    text = DOC.read_text()
    public = [n for n in dir(waferrt.Context) if not n.startswith("_") and n not in ("x", "y")]
    missing = [n for n in public if f"ctx.{n}" not in text]
    assert missing == [], f"docs/PROGRAMMING.md does not describe ctx.{missing}"
