"""What the subcommands share: WxH arguments and progress lines on stderr.

Contract: :func:`parse_wxh` is an argparse type for "WIDTHxHEIGHT" (two positive integers); :func:`say`
prints a progress line to stderr, stamped with the seconds since the command started ("i/n" counters
rewrite their line on a terminal).
"""

from __future__ import annotations

import argparse
import re
import sys
import time

_T0 = time.perf_counter()


def parse_wxh(text: str) -> tuple[int, int]:
    """'16x8' -> (16, 8): width x height, both positive integers (argparse type)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        w, h = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not WIDTHxHEIGHT: write two positive integers joined by 'x', e.g. 8x8 or 16x4"
        ) from None
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be at least 1, e.g. 8x8")
    return w, h


_COUNTER = re.compile(r"(\d+)/(\d+)")


def say(msg: str) -> None:
    """Progress on stderr; an 'i/n' counter rewrites its line on a terminal (elsewhere: only n/n shows)."""
    m = _COUNTER.search(msg)
    if m and m.group(1) != m.group(2):
        if sys.stderr.isatty():
            print(f"\r{_stamp()} {msg}", end="", file=sys.stderr, flush=True)
        return
    print(f"{chr(13) if m and sys.stderr.isatty() else ''}{_stamp()} {msg}", file=sys.stderr, flush=True)


def _stamp() -> str:
    """[waferrt 12.3s]: seconds since the command started, so a user sees where the time goes."""
    return f"[waferrt {time.perf_counter() - _T0:5.1f}s]"
