"""A Wafer cleans up after itself: on close, twice in a row, with its own Ray or a shared one, and on Ctrl-C.

What a Wafer owns: its tile actors (named ``tile(x,y)`` in a fresh namespace) and their worker processes,
their pyzmq sockets and ipc socket files (in a ``waferrt-*`` directory under the temp dir), and -- when it
started Ray -- Ray itself. After close none of these may be left. The embedded-Ray and Ctrl-C tests run in
a subprocess with private TMPDIR and RAY_TMPDIR, so that they neither meet the session's Ray nor see other
programs' files. (Ray itself keeps a socket and its event-log files per init/shutdown cycle in the driver,
whoever uses it; those are not counted as the Wafer's.)
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

from waferrt.actors.pool import KEEP_ENV
from waferrt.runtime import Wafer
from waferrt.serving.loop import crowding


@pytest.fixture(autouse=True)
def tiles_not_kept(monkeypatch):
    """What a Wafer leaves by default: no tile kept for the next one (tests/runtime/test_tile_pool keeps them)."""
    monkeypatch.setenv(KEEP_ENV, "0")


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def driver_fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def namespaces() -> set[str]:
    """Namespaces that hold live named actors (a Wafer's tiles live in a fresh one)."""
    import ray

    return {a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)}


def test_wafer_on_a_running_ray_joins_it_and_leaves_it_running(ray_session):
    with Wafer(mesh=(2, 1), tile=(1, 1)) as w:
        assert not w._started_ray
    assert ray_session.is_initialized()
    assert ray_session.get(ray_session.put(41)) == 41


def test_open_close_twice_leaks_nothing(ray_session):
    ray = ray_session
    fds_after = []
    for _ in range(2):
        before = namespaces()
        w = Wafer(mesh=(4, 2), tile=(2, 2)).open()
        try:
            pids = ray.get([h.pid.remote() for h in w.tiles.values()])
            mine = namespaces() - before
            ipc_dir = w._ipc_dir
            assert len(pids) == 2 and os.path.isdir(ipc_dir) and len(mine) == 1
        finally:
            w.close()
        assert wait_gone(pids) == [], "tile worker processes outlived the Wafer"
        assert not os.path.exists(ipc_dir), f"{ipc_dir} (the fabric's socket files) outlived the Wafer"
        left = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] in mine]
        assert left == [], f"actors still alive after close: {left}"
        fds = driver_fds()
        # the Wafer's own paths only: a venv or checkout whose path says "waferrt" is no leak
        assert not [t for t in fds.values() if t == ipc_dir or t.startswith(ipc_dir + os.sep)]
        fds_after.append(len(fds))
    assert fds_after[1] == fds_after[0], f"driver fds grew from {fds_after[0]} to {fds_after[1]}"


# -- in a subprocess: the Wafer starts and stops its own Ray -----------------------------------------------
@pytest.fixture
def private_tmp():
    d = tempfile.mkdtemp(prefix="wrt-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TMPDIR=d, RAY_TMPDIR=d)
    yield d, env
    shutil.rmtree(d, ignore_errors=True)


EMBEDDED = r"""
import glob, json, os, sys, tempfile, time
import psutil, ray
from waferrt.runtime import Wafer
me = psutil.Process()
reports = []
for _ in range(2):
    with Wafer(mesh=(4, 2), tile=(2, 2)) as w:
        w.dsm.alloc("x", (2, 4, 3), split=("y", "x", None))
        w.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))
        started = w._started_ray
        kids = [p.pid for p in me.children(recursive=True)]
        inbox = w.watch.inbox
    reports.append({"started_ray": started, "kids": kids, "ray_up": ray.is_initialized(),
                    "inet": len(me.net_connections("inet")), "inbox_closed": inbox.sock.closed,
                    "dirs": glob.glob(os.path.join(tempfile.gettempdir(), "waferrt-*"))})
print(json.dumps(reports))
"""


def test_embedded_ray_opened_and_closed_twice_leaks_nothing(private_tmp):
    tmp, env = private_tmp
    proc = subprocess.run([sys.executable, "-c", EMBEDDED], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in reports:
        assert r["started_ray"] and not r["ray_up"], "a Wafer with address=None starts Ray and stops it"
        assert len(r["kids"]) >= 3  # Ray's own processes and the two tile workers
        assert wait_gone(r["kids"]) == [], "Ray or tile processes outlived the Wafer"
        assert r["inet"] == 0 and r["dirs"] == [] and r["inbox_closed"]
    assert glob.glob(os.path.join(tmp, "waferrt-*")) == []


CTRL_C = r"""
import faulthandler, signal
faulthandler.register(signal.SIGUSR1)  # the test asks where it is stuck, if it does not end
from waferrt.runtime import Wafer
with Wafer(mesh=(4, 2), tile=(2, 2)) as w:
    w.dsm.alloc("x", (2, 4, 64), split=("y", "x", None))
    print("ready", w._ipc_dir, flush=True)
    while True:
        w.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x", "ring")))
"""


def _signal_masks(pid: int) -> str:
    """Each thread's SigPnd/SigBlk and the process's ShdPnd/SigIgn/SigCgt (hex masks: bit 1 is SIGINT)."""
    rows = []
    for status in [f"/proc/{pid}/status", *sorted(glob.glob(f"/proc/{pid}/task/*/status"))]:
        try:
            with open(status) as f:
                fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        rows.append(" ".join(f"{k}={fields[k].strip()}" for k in ("Name", "SigPnd", "ShdPnd", "SigBlk", "SigIgn",
                                                                    "SigCgt") if k in fields))
    return "\n".join(rows)


def _sigint_as_at_a_terminal() -> None:
    """In the driver's process before it runs: SIGINT's default action, as a terminal gives its foreground
    program. A test run started in the background (``.ci/run &``, ``nohup``) ignores SIGINT, its children
    inherit the ignore, and Python then installs no KeyboardInterrupt handler: the Ctrl-C never arrived."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_run_shuts_everything_down(private_tmp):
    tmp, env = private_tmp
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_at_a_terminal)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("ready"), f"the wafer did not start: {line!r} {proc.poll()}"
        ipc_dir = line.split()[1]
        time.sleep(0.5)  # let it run a few kernels
        kids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60 * crowding())  # a loaded machine stops Ray slower
        except subprocess.TimeoutExpired:
            masks = _signal_masks(proc.pid)  # SIGINT pending, blocked, ignored or caught, thread by thread
            proc.send_signal(signal.SIGUSR1)  # its threads' stacks to stderr
            time.sleep(2)
            proc.kill()
            pytest.fail(f"still running {60 * crowding():.0f} s after Ctrl-C; its signal masks:\n{masks}\n"
                        f"where:\n{proc.communicate()[1][-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    assert len(kids) >= 3
    assert wait_gone(kids) == [], "Ray or tile processes outlived Ctrl-C"
    assert not os.path.exists(ipc_dir)
    assert glob.glob(os.path.join(tmp, "waferrt-*")) == []


# -- a driver killed with SIGKILL, Ray's messages, SIGTERM ------------------------------------------------
KILLED = r"""
import os, signal, time
import ray
from waferrt.runtime import Wafer
from waferrt.actors.session import auth_mode
w = Wafer(mesh=(4, 2), tile=(2, 2)).open()
pid = ray.get(list(w.tiles.values())[1].pid.remote())
os.kill(pid, signal.SIGKILL)  # a tile dies: Ray tells the driver ("(raylet) A worker died ...")
time.sleep(5)
print("ready", w._ipc_dir, auth_mode(), flush=True)
time.sleep(600)
"""


def listening(pids) -> list[str]:
    """The addresses the processes `pids` listen on (TCP)."""
    out = []
    for pid in alive(pids):
        try:
            out += [c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            pass
    return out


def test_a_sigkilled_driver_leaves_nothing_running_and_an_ipc_dir_that_the_next_run_removes(private_tmp):
    """An embedded Ray runs with token authentication and listens on loopback only (GCS, raylet, workers, the
    tiles); the driver's stdout carried only what it printed and its stderr nothing of Ray's (Ray's message
    about the dead tile, "(raylet) A worker died ...", went to a logger); within a few seconds of its SIGKILL
    no process it started runs (Ray's dashboard and runtime-env agents included: waferrt.actors.reaper); its
    ipc directory, named after its pid, survives SIGKILL and the next Wafer's ``new_ipc_dir`` removes it."""
    tmp, env = private_tmp
    proc = subprocess.Popen([sys.executable, "-c", KILLED], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    kids, lines = [], []
    watchdog = threading.Timer(180, proc.kill)  # the wafer never started: end the wait
    watchdog.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready"):
                break
        assert lines and lines[-1].startswith("ready"), f"the wafer did not start: {lines} {proc.poll()}"
        _, ipc_dir, mode = lines[-1].split()
        assert mode == "token", f"Ray's token authentication is off ({mode})"
        kids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        servers = [q for q in map(psutil.Process, kids) if q.name() in ("gcs_server", "raylet")]
        assert servers and all(q.environ().get("RAY_AUTH_MODE") == "token" for q in servers)  # what they enforce
        addresses = listening([proc.pid, *kids])
        assert addresses and all(a in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for a in addresses), addresses
        proc.kill()
        left = wait_gone(kids, timeout=6)
        assert not left, f"outlived their driver by 6 s: {[psutil.Process(p).name() for p in alive(left)]}"
        rest, err = proc.communicate(timeout=30)
        out = "".join(lines) + rest
        assert out.splitlines() == [lines[-1].strip()], f"Ray printed to the program's stdout: {out!r}"
        assert "raylet" not in err.lower() and "worker died" not in err, f"Ray printed to its stderr: {err!r}"
        assert os.path.basename(ipc_dir).startswith(f"waferrt-{proc.pid}-") and os.path.isdir(ipc_dir)
        nxt = subprocess.run([sys.executable, "-c", "from waferrt.actors.session import new_ipc_dir; "
                              "import shutil; shutil.rmtree(new_ipc_dir())"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert nxt.returncode == 0, nxt.stderr
        assert not os.path.exists(ipc_dir) and glob.glob(os.path.join(tmp, "waferrt-*")) == []
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        for pid in wait_gone(kids, timeout=5):  # Ray reaps most of its processes when the driver dies
            os.kill(pid, signal.SIGKILL)


def test_sigterm_during_generate_shuts_the_wafer_down_quietly(private_tmp, tmp_path):
    """SIGTERM ends `waferrt generate` like Ctrl-C: one line, exit 143, no C++ stack dump from Ray, and
    nothing left (processes, ipc directory)."""
    import dataclasses

    from ggufs import Vocab, write_gguf

    from waferrt.model import synthetic_llama, tiny_config

    tmp, env = private_tmp
    model = tmp_path / "tiny.gguf"
    config = dataclasses.replace(tiny_config(), vocab_size=264)
    write_gguf(model, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    argv = [sys.executable, "-m", "waferrt.cli", "generate", "hello", "--model", str(model), "--spec", "tiny",
            "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "48", "--requests", "2", "--max-new-tokens", "40"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err, kids = [], []
    try:
        for line in proc.stderr:
            err.append(line)
            if "tile actors up" in line:
                kids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(err) + rest
    assert proc.returncode == 143, text[-3000:]
    assert text.strip().splitlines()[-1] == "waferrt: terminated (SIGTERM); the wafer was shut down"
    assert "SIGTERM received" not in text and "Traceback" not in text, text[-3000:]
    assert len(kids) >= 3 and wait_gone(kids) == []
    assert glob.glob(os.path.join(tmp, "waferrt-*")) == []
