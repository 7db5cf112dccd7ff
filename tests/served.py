"""A live ``waferrt serve`` for tests, in a subprocess on loopback (tests/ is on sys.path: ``from served import
serving``).

Contract: ``serving(argv, deadline_s)`` is a context manager that starts ``python -m waferrt.cli serve --port 0
*argv`` (its own embedded Ray), waits (at most `deadline_s`) for its line ``listening on http://HOST:PORT`` on
stderr and yields a :class:`Served` (``url``, ``log()``: its stderr so far). On exit it sends SIGINT, waits
30 s, then kills it. A server that exits or stays silent past the deadline fails the test with its stderr.
``tiny_model(folder)`` writes the tests' tiny llama GGUF (a byte vocabulary) and returns its path; ``TINY`` is the
placement flags that fit it on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

TINY = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "64", "--requests", "4"]
LISTENING = re.compile(r"listening on (http://[\w.\[\]:-]+)")


def tiny_model(folder) -> str:
    from ggufs import Vocab, write_gguf

    from waferrt.model import synthetic_llama, tiny_config

    path = folder / "tiny.gguf"
    config = dataclasses.replace(tiny_config(), vocab_size=264)  # the 256 bytes, "Ġt", unused ones
    write_gguf(path, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    return str(path)


@dataclasses.dataclass
class Served:
    url: str
    lines: list

    def log(self) -> str:
        return "".join(self.lines)


@contextlib.contextmanager
def serving(argv: list[str], deadline_s: float = 180.0):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "waferrt.cli", "serve", "--port", "0", *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        end, url = time.monotonic() + deadline_s, None
        while url is None:
            found = [m.group(1) for m in map(LISTENING.search, list(lines)) if m]
            url = found[0] if found else None
            if url is None and (proc.poll() is not None or time.monotonic() > end):
                pytest.fail(f"waferrt serve did not start within {deadline_s} s:\n{''.join(lines)[-3000:]}")
            time.sleep(0.1)
        yield Served(url, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reader.join(5)
