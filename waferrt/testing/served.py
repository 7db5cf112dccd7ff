"""A live ``waferrt serve`` in a subprocess on loopback, for tests and benchmarks that drive it over HTTP.

Contract: ``serving(argv, deadline_s)`` is a context manager that starts ``python -m waferrt.cli serve --port 0
*argv`` (with its own embedded Ray: ``RAY_ADDRESS`` is left out of its environment), waits at most
`deadline_s` for its line ``listening on http://HOST:PORT`` on stderr and yields a :class:`Served` (``url``;
``log()``: its stderr so far). A server that exits or stays silent past the deadline raises
:class:`ServerDidNotStart` with the end of its stderr. On exit it sends SIGTERM (which the
command handles; a SIGINT is ignored when the caller runs in the background), waits 30 s, then kills it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

LISTENING = re.compile(r"listening on (http://[\w.\[\]:-]+)")


class ServerDidNotStart(RuntimeError):
    pass


@dataclass
class Served:
    url: str
    lines: list

    def log(self) -> str:
        return "".join(self.lines)


def _wait_for_url(proc: subprocess.Popen, lines: list, deadline_s: float) -> str:
    end = time.monotonic() + deadline_s
    while True:
        found = [m.group(1) for m in map(LISTENING.search, list(lines)) if m]
        if found:
            return found[0]
        if proc.poll() is not None or time.monotonic() > end:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else f"silent for {deadline_s} s"
            raise ServerDidNotStart(f"waferrt serve {why}:\n{''.join(lines)[-3000:]}")
        time.sleep(0.1)


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
        yield Served(_wait_for_url(proc, lines, deadline_s), lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reader.join(5)
