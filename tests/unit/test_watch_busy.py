"""A silent tile on this machine is busy, not frozen, while its process runs and uses the CPU (actors.watch):
a real-size layer's weights cut on a loaded machine can starve its heartbeat thread for seconds. Real processes,
no Ray: a spinning one is working, a sleeping one and a stopped spinning one are not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from waferrt.actors.watch import _cpu_seconds, _working, machine_id

SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


@pytest.fixture
def process(request):
    p = subprocess.Popen([sys.executable, "-c", request.param])
    time.sleep(0.3)  # started
    yield p
    p.kill()
    p.wait()


def _used_cpu_meanwhile(pid: int) -> bool:
    before = _cpu_seconds(pid)
    time.sleep(1.0)  # the watch's ping wait (PING_S) plays this part
    return _working(pid, before)


@pytest.mark.parametrize("process", [SPIN], indirect=True)
def test_a_spinning_process_is_working(process):
    assert _used_cpu_meanwhile(process.pid)


@pytest.mark.parametrize("process", ["import time; time.sleep(30)"], indirect=True)
def test_a_sleeping_process_is_not(process):
    assert not _used_cpu_meanwhile(process.pid)


@pytest.mark.parametrize("process", [SPIN], indirect=True)
def test_a_stopped_process_is_not_even_with_cpu_behind_it(process):
    os.kill(process.pid, signal.SIGSTOP)
    end = time.monotonic() + 5
    while psutil.Process(process.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < end:
        time.sleep(0.01)  # the signal is delivered
    try:
        assert not _working(process.pid, 0.0)  # it has used CPU, but it is stopped (SIGSTOP: frozen)
    finally:
        os.kill(process.pid, signal.SIGCONT)


def test_a_process_that_is_gone_is_not_working():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert _cpu_seconds(p.pid) is None and not _working(p.pid, 0.0)


def test_this_machine_has_one_id():
    assert machine_id() == machine_id() != ""
