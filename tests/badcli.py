"""Bad command lines, run as a user would and held to one clear line (tests/unit/test_bad_input_*.py).

Contract: every test file of bad command lines holds a CASES list of (id, argv with {placeholders} for the
files of :func:`make_files`, words the one line must contain) and runs it through :func:`run_cases`: the cases
of each command in one subprocess (RUNNER: ``waferrt.cli.main`` on each argv in turn, as ``python -m
waferrt.cli`` would, stderr and stdout captured, SystemExit taken as the exit status, any other exception as a
traceback), so that a file takes seconds, not a minute of interpreter starts; :func:`suite` makes a file's
fixture and test of its CASES (``results, test_a_bad_command_line_is_one_clear_line = suite(CASES)``, the
fixtures ``cli_files`` and ``not_ray`` from tests/unit/conftest.py). :func:`check_one_line` is what
every case must give: exit status 2, one line on stderr (besides "[waferrt 0.3s] ..." progress lines) that
starts with "waferrt" and holds the words, no traceback, nothing on stdout, Ray not started, and within BOUND_S
of CPU time. :func:`one_line` runs one argv as its own ``python -m waferrt.cli`` (the real entry point). The bound
is CPU seconds, not wall (a loaded machine stretches wall time, not the work done); what it separates is "refused
while parsing" (well under a second once the modules are imported) from "refused after the model loaded" (its
dequantising alone is seconds of CPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from ggufs import Vocab, write_gguf

from waferrt.faults import FaultPlan, NodeLoss
from waferrt.model import synthetic_llama, tiny_config, tiny_moe_config

BOUND_S = 10.0
TINY_WAFER = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8"]
LONG_PROMPT = "to be or not to be " * 6  # 103 tokens of the tiny vocabulary (bytes and "Ġt")

PLANS = {"broken_yaml": ("plan.yaml", "faults:\n  - kind: core\n    core: [1, 2\n"),
         "broken_json": ("plan.json", '{"faults": ['),
         "list_plan": ("list.json", "[1, 2]"),
         "text_plan": ("text.yaml", "just some words\n"),
         "off_core": ("off_core.json", '{"faults": [{"kind": "core", "core": [99, 99]}]}'),
         "off_link": ("off_link.yaml", "faults:\n- kind: link\n  a: [100, 0]\n  b: [101, 0]\n"),
         "off_tile": ("off_tile.json", '{"faults": [{"kind": "tile", "tile": [5, 5]}]}')}


def make_files(d: Path) -> dict[str, str]:
    """Model files, good and broken, prompt files and fault plans in `d`: placeholder name -> path."""
    config = dataclasses.replace(tiny_config(), vocab_size=264)
    good = d / "tiny.gguf"
    write_gguf(good, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    data = good.read_bytes()
    out = {"tiny": good, "cut": d / "cut.gguf", "four": d / "four.gguf", "bare": d / "bare.gguf",
           "header_cut": d / "header_cut.gguf", "text": d / "notes.gguf", "binary": d / "prompts.bin",
           "blank": d / "blank.txt", "dir": d}
    out["cut"].write_bytes(data[: len(data) * 2 // 3])
    out["four"].write_bytes(b"GGUF")
    out["bare"].write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # version 3, 0 tensors, 0 keys
    out["header_cut"].write_bytes(data[:200])
    out["text"].write_text("just some notes\n")
    out["binary"].write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    out["blank"].write_text("\n   \n\n")
    out["nodeplan"] = d / "nodes.json"
    FaultPlan((NodeLoss(2),)).save(out["nodeplan"])  # loses node 2: needs three nodes
    out["badplan"] = d / "bad.json"
    out["badplan"].write_text('{"faults": [{"kind": "meteor"}]}')
    for key, (name, text) in PLANS.items():
        out[key] = d / name
        out[key].write_text(text)
    out["huge"] = d / "huge.txt"
    out["huge"].write_bytes(b"a prompt\n" * (2 << 20))  # 18 MB
    moe = dataclasses.replace(tiny_moe_config(), vocab_size=264)
    out["moe"] = d / "moe.gguf"
    write_gguf(out["moe"], moe, synthetic_llama(moe, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    out["plandir"] = d / "plans.json"  # a directory where a file is expected
    out["plandir"].mkdir()
    out["fifo"] = d / "out.fifo"  # an output path that is no regular file: written, it would block forever
    os.mkfifo(out["fifo"])
    return {k: str(v) for k, v in out.items()} | {"tiny_size": str(len(data)), "cut_size": str(len(data) * 2 // 3)}


def values(files: dict[str, str], not_ray: str) -> dict:
    """What the {placeholders} of a case are filled with."""
    return {**files, "tiny_size": int(files["tiny_size"]), "cut_size": int(files["cut_size"]), "not_ray": not_ray}


# Runs each argv of a JSON list (stdin) through waferrt.cli.main in this one process; prints a JSON list of
# {status, stdout, stderr, wall} (status: main's return or SystemExit's code; "traceback" when it raised).
RUNNER = """
import contextlib, io, json, sys, time, traceback
from waferrt.cli import main

out = []
for argv in json.load(sys.stdin):
    err, std = io.StringIO(), io.StringIO()
    t0 = time.process_time()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (print(e.code, file=sys.stderr) or 1)
        except BaseException:
            status = "traceback"
            traceback.print_exc()
    ray = sys.modules.get("ray")
    out.append({"status": status, "stdout": std.getvalue(), "stderr": err.getvalue(),
                "cpu": time.process_time() - t0, "ray": bool(ray and ray.is_initialized())})
print(json.dumps(out))
"""


def run_cases(cases: list, filled: dict, cache: Path) -> dict[str, dict]:
    """Case id -> what running it gave (`filled`: the placeholders' values; `cache`: an empty WAFERRT_CACHE);
    the cases of each command in one subprocess, the subprocesses side by side."""
    env = {**os.environ, "WAFERRT_CACHE": str(cache)}
    by_command: dict[str, list] = {}
    for case_id, argv, _ in cases:
        by_command.setdefault(argv[0], []).append((case_id, [a.format(**filled) for a in argv]))
    procs = {cmd: subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env) for cmd in by_command}
    out = {}
    try:
        for cmd, proc in procs.items():
            stdout, stderr = proc.communicate(json.dumps([argv for _, argv in by_command[cmd]]), timeout=300)
            assert proc.returncode == 0, stderr[-3000:]
            out.update(zip([case_id for case_id, _ in by_command[cmd]], json.loads(stdout), strict=True))
    finally:  # a command whose cases hang (one that decodes instead of refusing) is not left running
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def check_one_line(got: dict, words: str) -> None:
    """A case's run said what was wrong in one line, exit 2, fast (module docstring)."""
    lines = [line for line in got["stderr"].splitlines() if not line.startswith("[waferrt ")]  # not progress
    assert got["status"] == 2, got["stderr"][-2000:]
    assert "Traceback" not in got["stderr"] and len(lines) == 1, got["stderr"][-2000:]
    assert words in lines[0]
    assert lines[0].startswith("waferrt"), lines[0]
    assert got["stdout"] == ""
    assert not got["ray"], "Ray was started: the command line must be refused before Ray is asked"
    assert got["cpu"] < BOUND_S, f"took {got['cpu']:.1f} CPU s: was it checked only after the model loaded?"


def one_line(argv: list[str], words: str, env: dict) -> None:
    """`python -m waferrt.cli` itself: exit status 2, the one line, no traceback, before anything loads."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", *argv], capture_output=True, text=True, timeout=120,
                          env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and words in proc.stderr and proc.stdout == ""
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # not wall: the machine is shared
    assert cpu < BOUND_S, f"took {cpu:.1f} CPU s: was it refused only after the model loaded or Ray started?"


def suite(cases: list):
    """(the module's ``results`` fixture, its test) for a file's CASES: each case one clear line."""
    @pytest.fixture(scope="module", name="results")
    def results(cli_files, not_ray, tmp_path_factory) -> dict[str, dict]:
        return run_cases(cases, values(cli_files, not_ray), tmp_path_factory.mktemp("cache"))

    @pytest.mark.parametrize("case_id, words", [(c[0], c[2]) for c in cases], ids=[c[0] for c in cases])
    def test_a_bad_command_line_is_one_clear_line(case_id, words, results, cli_files, not_ray):
        check_one_line(results[case_id], words.format(**values(cli_files, not_ray)))

    return results, test_a_bad_command_line_is_one_clear_line
