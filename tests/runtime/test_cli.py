"""The ``waferrt`` command and the examples: help that teaches, argument errors that say what to type,
subcommand modules loaded only when needed, and ``demo`` and every ``examples/*.py`` with a ``main()``
running for real (joining the session's Ray) and checking itself against numpy."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import pathlib
import re
import subprocess
import sys

import pytest
from tracecheck import check_messages

from waferrt import cli
from waferrt.cli.common import parse_wxh

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_help_describes_the_wafer_and_lists_every_subcommand():
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2D mesh of small cores" in proc.stdout and "examples:" in proc.stdout
    for command in cli.COMMANDS:
        assert f"    {command} " in proc.stdout, f"{command} missing from --help"


def test_wxh_parsing_teaches_the_format():
    assert parse_wxh("16x8") == (16, 8) and parse_wxh("3X2") == (3, 2)
    bad_inputs = (("8", "WIDTHxHEIGHT"), ("8x", "WIDTHxHEIGHT"), ("axb", "e.g. 8x8"), ("0x4", "at least 1"))
    for bad, hint in bad_inputs:
        with pytest.raises(argparse.ArgumentTypeError, match=hint):
            parse_wxh(bad)
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", "demo", "--mesh", "8by8"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "'8by8' is not WIDTHxHEIGHT" in proc.stderr


def test_a_subcommand_imports_only_its_own_module():
    probe = ("import sys; from waferrt import cli; cli.build_parser(['demo']).parse_args(['demo']); "
             "print(sorted(m for m in sys.modules if m.startswith('waferrt.cli.')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert eval(proc.stdout) == ["waferrt.cli.common", "waferrt.cli.demo"]


def test_demo_runs_and_checks_itself(ray_session, capsys):
    assert cli.main(["demo", "--mesh", "6x4", "--tile", "3x2", "--algo", "ring"]) == 0
    out = capsys.readouterr().out
    assert "2x2 tiles of 3x2" in out and "matches numpy" in out and "allreduce.ring" in out


def test_demo_rejects_a_tile_larger_than_the_mesh(capsys):
    assert cli.main(["demo", "--mesh", "4x4", "--tile", "8x8"]) == 2
    assert "tile 8x8 is larger than the mesh 4x4" in capsys.readouterr().err


EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if "\ndef main(" in p.read_text())
SAYS = {  # what each example prints when it checked itself (beyond exiting 0)
    "allreduce": ["ktree: matches numpy; modelled", "ring: matches numpy; modelled"],
    "fault_tolerant_allreduce": ["plain allreduce, all 64 cores: matches numpy", "CoreFailed: core (x=3, y=4) is dead",
                                 "fault-tolerant allreduce around core (x=3, y=4): matches numpy over the 63 living"],
    "custom_kernel": ["heat, 10 steps: matches numpy", "MeshGEMV 64x96: matches numpy", "all runs on this wafer"],
    "generate": ["the same tokens as the numpy reference", "modelled wafer"],
}


def test_the_examples_are_all_run():
    assert {p.stem for p in EXAMPLES} == set(SAYS), "a new example needs its line in SAYS"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_runs_and_checks_itself(ray_session, capsys, path):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # an example with a backend runs locally here: test_examples_both_ways shows that on Ray it prints the same
    local = "backend" in inspect.signature(example.main).parameters
    assert (example.main("local") if local else example.main()) == 0
    out = capsys.readouterr().out
    for line in SAYS[path.stem]:
        assert line in out, f"examples/{path.name} did not print {line!r}:\n{out}"
    if path.stem == "custom_kernel":  # its trace: every message of the stencil an arrow
        trace = re.search(r"trace of the stencil: (\S+)", out).group(1)
        assert check_messages(json.loads(pathlib.Path(trace).read_text()))
