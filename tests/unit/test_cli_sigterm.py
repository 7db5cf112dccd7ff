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
