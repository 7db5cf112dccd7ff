"""The reaper (waferrt.actors.reaper) stops what a SIGKILLed driver started, without Ray: a driver process
starts a middle process that starts a leaf (as a raylet starts its dashboard agent), then the middle one exits
and the leaf is reparented -- no longer the driver's descendant when the reaper lists them again, as when a
list is taken while the driver and its raylet die. The leaf was seen: it is stopped all the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

DRIVER = r"""
import subprocess, sys, time
from waferrt.actors.reaper import POLL_S, start_reaper
other = subprocess.Popen(["sleep", "600"])  # stays the driver's child (as the GCS does): no list is empty
mid = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; leaf = subprocess.Popen(['sleep', '600']); "
                        "print(leaf.pid, flush=True); sys.stdin.readline()"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
leaf = int(mid.stdout.readline())
reaper = start_reaper()  # returns once its first list (the middle process and the leaf) is taken
print(leaf, other.pid, flush=True)
time.sleep(1.5 * POLL_S)
mid.stdin.write("\n"); mid.stdin.flush(); mid.wait()  # the leaf is reparented
time.sleep(2.5 * POLL_S)  # two more lists without it
print("go", flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_seen_once_is_stopped_though_reparented_before_the_driver_died():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    leaves = []
    try:
        leaves = [int(pid) for pid in proc.stdout.readline().split()]
        leaf = leaves[0]
        assert proc.stdout.readline().strip() == "go"
        assert _running(leaf) and leaf not in {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        proc.kill()
        deadline = time.monotonic() + 10  # SIGTERM at once; the grace before SIGKILL is 2 s
        while any(map(_running, leaves)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(leaf), "the reaper left the reparented leaf running"
        assert not any(map(_running, leaves))
    finally:
        proc.kill()
        proc.wait(timeout=10)
        for pid in filter(_running, leaves):
            os.kill(pid, signal.SIGKILL)
