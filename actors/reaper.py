"""Nothing of a run outlives its driver: a small watchdog process that stops what the driver started when the
driver dies without stopping it (SIGKILL, a crash).

Contract: :func:`start_reaper` (called by ``waferrt.actors.session.ray_init``) starts this file as a script
(``python .../reaper.py``: the standard library and psutil, not the waferrt package, so that it is up in
milliseconds even on a loaded machine) in a session of its own, holding the read end of a pipe whose write end
only the driver holds, and waits (at most :data:`UP_S`) for its first list: a driver killed right after
``ray.init`` still has its Ray stopped. While the driver lives the reaper lists, about once a second, the
driver's descendants (the Ray processes an embedded ``ray.init`` or a LocalCluster started: GCS, raylets,
their dashboard and runtime-env agents, workers; itself excluded). When the pipe closes -- the driver is
gone, however it ended -- it sends SIGTERM to every process of its lists that is still the same process
(pid and start time), SIGKILL to those left after :data:`GRACE_S`, and exits. :func:`stop_reaper` (after a
clean ``ray.shutdown``) tells it to exit without touching anything. It only ever signals the driver's own
descendants: a Ray this program did not start is never stopped. Why it is needed: Ray's raylet and GCS die
with their driver (PR_SET_PDEATHSIG), but the raylet's dashboard and runtime-env agents were seen alive 45 s
after their driver was killed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 1.0  # how often the driver's descendants are listed
UP_S = 10.0  # how long start_reaper waits for the reaper's first list (it goes on without it after)
GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
BYE = b"bye\n"  # the driver's clean goodbye: exit, stop nothing


def start_reaper() -> subprocess.Popen:
    """The watchdog of this driver (keep the returned Popen: its stdin is the pipe the reaper watches)."""
    reaper = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid())],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True)  # Ctrl-C to the driver's group does not reach it
    select.select([reaper.stdout], [], [], UP_S)  # its first list is taken (or it is slow: go on)
    reaper.stdout.close()
    return reaper


def stop_reaper(reaper: subprocess.Popen) -> None:
    """Ray was shut down cleanly: let the reaper go without stopping anything."""
    try:
        reaper.stdin.write(BYE)
        reaper.stdin.close()
    except OSError:  # it is gone already
        pass
    try:
        reaper.wait(timeout=5)
    except subprocess.TimeoutExpired:
        reaper.kill()


def _descendants(driver: int, me: int) -> dict[int, float]:
    """pid -> start time of every descendant of `driver` but this process."""
    import psutil

    try:
        kids = psutil.Process(driver).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for p in kids:
        try:
            if p.pid != me:
                out[p.pid] = p.create_time()
        except psutil.Error:
            pass
    return out


def _still(procs: dict[int, float]) -> list:
    """The processes of `procs` that still run as the same process (a reused pid is left alone)."""
    import psutil

    out = []
    for pid, started in procs.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _stop(procs: dict[int, float]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = _still(procs)
        for p in left:
            try:
                p.send_signal(sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE_S
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _still(procs)
        if not left:
            return


def watch(driver: int, pipe: int) -> None:
    """List `driver`'s descendants until `pipe` closes (stop them) or says BYE (stop nothing)."""
    procs = _descendants(driver, os.getpid())
    try:
        os.write(sys.stdout.fileno(), b"up\n")  # start_reaper goes on
    except OSError:  # it stopped waiting
        pass
    while True:
        # every descendant seen that still runs: a list taken while the driver dies misses what its dying
        # raylet had started (reparented by then), so a new list adds to the last instead of replacing it
        procs = {p.pid: p.create_time() for p in _still(procs)} | _descendants(driver, os.getpid())
        ready, _, _ = select.select([pipe], [], [], POLL_S)
        if ready:
            data = os.read(pipe, len(BYE))
            if data != BYE:  # EOF: the driver is gone without saying goodbye
                _stop(procs)
            return


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), sys.stdin.fileno())
