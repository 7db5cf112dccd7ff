"""A live ``waferrt serve`` for tests (tests/ is on sys.path: ``from serving import live_server``).

``live_server(args, tmp)`` starts the server as its own process (its own embedded Ray, loopback, a free
port) on a small GGUF written here, waits until it listens (bounded), yields its base URL, and stops it
(SIGTERM, then kill) -- also when the test fails, and when the test process dies (the server's SIGTERM).
``TINY`` is the model's flags; ``reference(prompts, n)`` the texts ``waferrt generate --reference`` prints
for them (greedy), which the wafer's equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

from ggufs import Vocab, write_gguf

from waferrt.model import synthetic_llama, tiny_config

START_S = 240.0  # the longest a server may take to listen (Ray and the tiles start on a loaded machine)
FLAGS = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "160", "--requests", "4"]


def tiny_gguf(folder) -> str:
    path = os.path.join(folder, "tiny.gguf")
    config = dataclasses.replace(tiny_config(), vocab_size=264)  # the 256 bytes, "Ġt", unused ones
    write_gguf(path, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    return path


@contextlib.contextmanager
def live_server(args: list[str], folder):
    log = open(os.path.join(folder, "serve.log"), "w+")
    env = dict(os.environ, WAFERRT_CACHE=os.path.join(folder, "cache"))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "waferrt.cli", "serve", "--port", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True,
                            preexec_fn=_sigterm_when_the_test_process_dies)
    try:
        yield _url(proc, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def _sigterm_when_the_test_process_dies() -> None:
    """In the server's process before it runs: SIGTERM to it when the pytest process that started it dies,
    however that ends (a CI timeout's SIGTERM to pytest's group does not reach the server's own session)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _url(proc, log) -> str:
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        log.seek(0)
        text = log.read()
        if "listening on " in text:
            return text.split("listening on ", 1)[1].split()[0]
        if proc.poll() is not None:
            raise RuntimeError(f"waferrt serve exited {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"waferrt serve did not listen within {START_S:.0f}s")


def reference(model: str, prompts: list[str], max_tokens: int) -> list[str]:
    """What `waferrt generate --reference --json` prints for `prompts`, greedy (a subprocess: no Ray)."""
    out = subprocess.run([sys.executable, "-m", "waferrt.cli", "generate", *prompts, "--model", model, "--reference",
                          "--json", "--max-new-tokens", str(max_tokens)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    return got["text"] if isinstance(got["text"], list) else [got["text"]]
