"""Not collected by the suite (no test_ prefix): tests/unit/test_cli_sigterm.py runs it as a pytest of its own
and SIGTERMs that pytest while the first test runs a long `waferrt train` in-process (numpy, no Ray). The
second test must never start: it leaves a mark where WAFERRT_SIGTERM_MARK says."""

from __future__ import annotations

import os
from pathlib import Path

from waferrt.cli import main


def test_a_long_in_process_command():
    main(["train", "--model", "tiny", "--steps", "100000"])


def test_the_next_one_never_starts():
    Path(os.environ["WAFERRT_SIGTERM_MARK"]).write_text("the session went on after SIGTERM\n")
