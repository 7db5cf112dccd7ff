"""`waferrt chaos` ends with the command that runs the same campaign again: every flag that shapes the run is in
it (the expert mapping and NI-Balancer's period of an MoE too), and it parses back to the same arguments."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

from waferrt.cli import build_parser
from waferrt.cli.chaos import _again, _check


def _args(argv: list[str]):
    args = build_parser(argv).parse_args(argv)
    _check(args)
    return args


def test_the_command_to_run_again_keeps_every_flag_of_the_campaign():
    argv = ["chaos", "--model", "tinymoe", "--faults", "3", "--seed", "5", "--kinds", "core,straggler",
            "--experts", "naive", "--balance", "2", "--max-new-tokens", "6", "--requests", "2", "--policy", "fail-fast"]
    first = _args(argv)
    again = shlex.split(_again(first, SimpleNamespace(seed=5)))
    assert again[:2] == ["waferrt", "chaos"]
    second = _args(again[1:])
    keep = ("model", "faults", "seed", "kinds", "experts", "balance", "max_new_tokens", "requests", "policy")
    assert {k: getattr(second, k) for k in keep} == {k: getattr(first, k) for k in keep}
