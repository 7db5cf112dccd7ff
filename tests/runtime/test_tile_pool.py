"""Kept tile actors (waferrt.actors.pool, WAFERRT_KEEP_TILES): a closed Wafer's healthy tiles serve the next
Wafer, made new; a tile with a thread of its own still running, one past the limit, and one that died while
kept are never handed out; off (the default), a closed Wafer's processes are gone (tests/runtime/test_lifecycle).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from waferrt.actors.decoding import THREAD as LOOP_THREAD
from waferrt.actors.pool import KEEP_ENV, POOL, keep_limit
from waferrt.actors.tile import Tile
from waferrt.runtime import Wafer

MESH, TILE = (4, 2), (2, 2)  # two tiles


@pytest.fixture
def keep(ray_session, monkeypatch):
    """Tiles kept (up to `n`), the pool empty before and after the test."""
    def set_limit(n: int) -> None:
        monkeypatch.setenv(KEEP_ENV, str(n))

    POOL.drain()
    set_limit(4)
    yield set_limit
    POOL.drain()


def pids(wafer: Wafer) -> dict:
    return dict(zip(wafer.tiles, wafer.call([(t, Tile.pid, ()) for t in wafer.tiles])))


def gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_the_next_wafer_runs_on_the_kept_processes_and_holds_nothing_of_the_last(keep):
    with Wafer(mesh=MESH, tile=TILE) as w:
        first = pids(w)
        w.dsm.alloc("x", (2, 4, 3), split=("y", "x", None))
        w.dsm.put("x", np.ones((2, 4, 3), np.float32))
        held = w.sram()
    assert POOL.count() == 2
    with Wafer(mesh=MESH, tile=TILE) as w:
        assert sorted(pids(w).values()) == sorted(first.values())  # the same processes, no new worker
        assert POOL.count() == 0
        assert all(s["tensors"] == 0 for s in w.sram()) and all(s["tensors"] == 1 for s in held)
        nothing_dead = {"cores": [], "links": [], "lost": [], "fired": []}
        assert w.call([(t, Tile.dead, ()) for t in w.tiles]) == [nothing_dead] * 2
        w.dsm.alloc("y", (2, 4, 3), split=("y", "x", None))  # the fabric works: an allreduce across the tiles
        w.dsm.put("y", np.arange(24, dtype=np.float32).reshape(2, 4, 3))
        w.run(lambda ctx: ctx.store("y", ctx.allreduce(ctx.load("y"), "x")))
        want = np.arange(24, dtype=np.float32).reshape(2, 4, 3).sum(axis=1, keepdims=True).repeat(4, axis=1)
        np.testing.assert_array_equal(w.dsm.get("y"), want)


def _stray_thread(ctx) -> None:
    """A kernel that leaves a thread named as a tile's own decode loop running on the tiles of column 0."""
    if ctx.local.x0 == 0:
        threading.Thread(target=time.sleep, args=(30,), name=LOOP_THREAD, daemon=True).start()


def test_a_tile_with_a_thread_of_its_own_left_running_is_not_kept(keep):
    with Wafer(mesh=MESH, tile=TILE) as w:
        before = pids(w)
        w.run(_stray_thread)
    left, right = before[min(before)], before[max(before)]
    assert POOL.count() == 1 and gone(left) and not gone(right, timeout=0.5)


def test_past_the_limit_and_when_off_the_tiles_are_killed(keep):
    keep(1)
    with Wafer(mesh=MESH, tile=TILE) as w:
        before = pids(w)
    assert POOL.count() == 1 and sum(gone(p, timeout=5) for p in before.values()) == 1
    keep(0)
    with Wafer(mesh=MESH, tile=TILE) as w:  # off: the kept one is not taken, and none is kept
        fresh = pids(w)
    assert not set(fresh.values()) & set(before.values()) and all(gone(p) for p in fresh.values())
    assert POOL.count() == 1  # the one kept before stays until drained


def test_a_kept_tile_that_died_is_skipped(keep):
    with Wafer(mesh=MESH, tile=TILE) as w:
        before = pids(w)
    for pid in before.values():
        os.kill(pid, 9)
    assert all(gone(p) for p in before.values())
    with Wafer(mesh=MESH, tile=TILE) as w:
        assert not set(pids(w).values()) & set(before.values())
        w.dsm.alloc("z", (2, 4, 1), split=("y", "x", None))
        w.run(lambda ctx: ctx.store("z", ctx.allreduce(ctx.load("z") + 1, "x")))
        assert float(w.dsm.get("z").sum()) == 2 * 4 * 4


@pytest.mark.parametrize("raw", ["-1", "many", "2.5"])
def test_a_bad_keep_value_says_what_to_write(monkeypatch, raw):
    monkeypatch.setenv(KEEP_ENV, raw)
    with pytest.raises(ValueError, match=rf"{KEEP_ENV}=.*a whole number >= 0 \(e.g. {KEEP_ENV}=8\)"):
        keep_limit()
