"""SIGTERM ends a waferrt command like Ctrl-C: one line, exit 143 -- also when the signal lands inside Ray's
deserialization, which wraps the exception the handler raises into its own RaySystemError (the race
tests/runtime/test_lifecycle.py's SIGTERM test met once). No Ray here: the command is a stand-in that
takes the signal the way that race did."""

from __future__ import annotations

import signal

import pytest

import waferrt.cli as cli
import waferrt.cli.plan as plan_cli


class RaySystemError(Exception):  # what ray.exceptions.RaySystemError is to this test: some other exception
    pass


@pytest.mark.parametrize("wrapped", [False, True])
def test_sigterm_ends_the_command_quietly_even_when_wrapped(monkeypatch, capsys, wrapped):
    def run(args):
        try:
            cli._terminate(signal.SIGTERM, None)
        except cli.Terminated as e:
            if wrapped:
                raise RaySystemError("System error: waferrt.cli.Terminated") from e
            raise

    monkeypatch.setattr(plan_cli, "run", run)
    assert cli.main(["plan"]) == 143
    assert capsys.readouterr().err.strip() == "waferrt: terminated (SIGTERM); the wafer was shut down"


def test_another_error_is_not_taken_for_sigterm(monkeypatch):
    def run(args):
        raise RaySystemError("a real failure")

    monkeypatch.setattr(plan_cli, "run", run)
    with pytest.raises(RaySystemError, match="a real failure"):
        cli.main(["plan"])


def _first_line_with(proc, words: str, deadline_s: float) -> list[str]:
    """`proc`'s output lines up to the first holding `words` (all of them when it ends or `deadline_s` passes)."""
    import queue
    import threading
    import time

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen, end = [], time.monotonic() + deadline_s
    while (left := end - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if words in line:
            break
    return seen


def test_a_sigterm_to_pytest_stops_it_during_an_in_process_command(tmp_path):
    """SIGTERM to a pytest's whole process group while a test runs a waferrt command in-process stops the
    session: the CLI takes SIGTERM only when it is the program (main() with no argv), so the signal is
    pytest's, not turned into that command's exit 143 with the next test started."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    victim = Path(__file__).parent.parent / "sigterm_victim.py"
    mark = tmp_path / "went-on"
    env = {**os.environ, "WAFERRT_SIGTERM_MARK": str(mark)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(victim)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        seen = _first_line_with(proc, " loss ", deadline_s=120)  # the command is under way: a step done
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)  # ends within seconds; the deadline only bounds a failure
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(seen)
    assert " loss " in text, text[-2000:]
    assert not mark.exists(), text[-2000:]
    assert proc.returncode != 0, text[-2000:]
