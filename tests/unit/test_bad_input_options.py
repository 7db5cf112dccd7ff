"""Every option of every subcommand, walked from the parsers themselves (so that a new option cannot be missed):
each bad value of BAD (wrong type, negative, zero, not a number, overflow, a missing file, a directory) that an
option refuses while parsing is refused with exit status 2 and one line naming the option, no traceback; every
option that takes a value refuses at least one of them, or EXEMPT says why it takes any text (and where what it
names is checked). No model loads and no Ray starts: argparse alone. The cases that need a model or a mesh, and
their exact words, are the tables of tests/unit/test_bad_input_*.py."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from waferrt.cli import COMMANDS, build_parser

BAD = ("abc", "-1", "0", "nan", "1e999", "/nonexistent/x", ".")

EXEMPT = {  # (command, option) -> why any text passes parsing
    ("generate", "--system"): "any text is a system prompt",
    ("estimate", "--model"): "a named model or a GGUF path: checked when read (test_bad_input_paper.py)",
    ("sweep", "--model"): "a named model or a GGUF path: checked when read (test_bad_input_paper.py)",
    ("chaos", "--plan"): "a fault plan file: read and checked after parsing (test_bad_input_plan.py)",
    ("serve", "--host"): "any host name: bound when the server starts",
    ("serve", "--api-key"): "any text is a key",
    ("bench", "--api-key"): "any text is a key",
    ("bench", "--served-model-name"): "any name: the server answers 404 for one it does not serve",
}


def _options() -> list[tuple[str, str]]:
    """(command, option) of every option that takes a value, of every subcommand."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(command, action.option_strings[-1]) for command, p in sub.choices.items() for action in p._actions
            if action.option_strings and action.nargs != 0 and not isinstance(action, argparse._HelpAction)]


OPTIONS = _options()


def _positionals(command: str, folder) -> list[str]:
    """Good values of `command`'s required positional arguments (a file to write in `folder`), so that a
    refusal is the option's."""
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [str(folder / "out.gguf") for a in sub.choices[command]._actions
            if not a.option_strings and a.nargs is None and a.required]


def _parse(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as e:
            return int(e.code or 0), err.getvalue()
    return 0, err.getvalue()


def test_every_command_is_walked():
    assert {c for c, _ in OPTIONS} >= set(COMMANDS) - {"demo"} and len(OPTIONS) > 100, OPTIONS
    assert set(EXEMPT) <= set(OPTIONS), set(EXEMPT) - set(OPTIONS)


@pytest.mark.parametrize("command, option", OPTIONS, ids=[f"{c} {o}" for c, o in OPTIONS])
def test_an_options_bad_values_are_one_line_naming_it(command, option, tmp_path):
    refused, rest = [], _positionals(command, tmp_path)
    for value in BAD:
        status, err = _parse([command, option, value, *rest])
        if status:
            assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, (value, err)
            named = err.split(":")[1] if err.count(":") > 1 else ""  # " argument --on/--backward" (its aliases too)
            assert err.startswith(f"waferrt {command}: argument ") and option in named.split()[-1].split("/"), err
            refused.append(value)
    if (command, option) in EXEMPT:
        return
    assert refused, f"waferrt {command} {option} takes every one of {BAD}: refuse bad values in its argparse type " \
                    "(waferrt/cli/common.py), or say in EXEMPT why any text will do"
