"""Progress on stderr: bars on a terminal (tqdm), the last line of a counter elsewhere, nothing per token
unless -v."""

from __future__ import annotations

import io
import sys
import threading

from waferrt.cli.common import say, stamp
from waferrt.cli.progress import DecodeBar, waiting


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_counters_are_bars_on_a_terminal_and_one_line_elsewhere(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    for i in range(1, 5):
        say(f"weights into core SRAM: {i}/4 regions")
    say("decoding on the wafer")
    out = tty.getvalue()
    assert "weights into core SRAM" in out and "4/4" in out and "100%" in out and "regions" in out
    assert "decoding on the wafer" in out
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    for i in range(1, 5):
        say(f"weights into core SRAM: {i}/4 regions")
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("weights into core SRAM: 4/4 regions") and "%" not in lines[0]


def test_decode_tokens_per_second_on_a_terminal_and_lines_only_when_verbose(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = DecodeBar(6, False, stamp)
    for i in range(6):
        bar.token(i % 2, 100 + i, "")
    bar.close()
    assert "decoding" in tty.getvalue() and "tok/s" in tty.getvalue()
    for verbose, want in ((False, 0), (True, 3)):
        log = io.StringIO()
        monkeypatch.setattr(sys, "stderr", log)
        bar = DecodeBar(3, verbose, stamp)
        for i in range(3):
            bar.token(0, i, "length" if i == 2 else "")
        bar.close()
        assert log.getvalue().count("request 0: token") == want
        assert "(length), 3 in all" in log.getvalue() or not verbose


def test_waiting_shows_the_time_on_a_terminal(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    done = threading.Event()
    th = threading.Thread(target=done.wait, args=(0.5,))
    th.start()
    waiting("model weights", th, stamp())
    assert not th.is_alive() and "model weights: 00:0" in tty.getvalue()
