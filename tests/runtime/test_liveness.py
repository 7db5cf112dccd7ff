"""Frozen and dead tiles end a run within seconds, with an error that names the right tile.

SIGSTOP freezes a tile's process (its heartbeats stop, it answers nothing): ``wafer.run`` raises
TileStalled naming it. SIGKILL kills a tile that is not the first one: it raises TileDied naming it, well
before any fabric deadline; the wafer then refuses further work at once. ``WaferLLM.generate`` recovers
from either (restarts the tile, replays the requests: the same tokens, the fault in ``stats.faults``), or
under a fail-fast plan raises FaultStop from TileStalled/TileDied naming the tile, with the tokens it had
made attached. Every case closes cleanly afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest

from waferrt.actors.tile import Tile
from waferrt.actors.watch import TileDied, TileStalled
from waferrt.core.mesh import MeshSpec, TileId
from waferrt.core.spec import TINY
from waferrt.faults import FaultPlan
from waferrt.faults.errors import FaultStop
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.runtime import STALL_S, Launch, Wafer
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest

VICTIM = TileId(1, 0)
WITHIN = STALL_S + 10.0  # the heartbeat deadline, a ping, and a loaded machine's slack; far below 30 s


def _pid(wafer: Wafer, tile: TileId) -> int:
    (pid,) = wafer.call([(tile, Tile.pid, ())])
    return pid


def _allreduce(wafer: Wafer) -> None:
    wafer.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))


@pytest.mark.parametrize("sig,error", [(signal.SIGSTOP, TileStalled), (signal.SIGKILL, TileDied)])
def test_a_kernel_on_a_wafer_with_a_frozen_or_dead_tile(ray_session, sig, error):
    wafer = Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), launch=Launch(timeout=30.0)).open()
    pid = _pid(wafer, VICTIM)
    try:
        wafer.dsm.alloc("x", (2, 4, 3), split=("y", "x", None))
        os.kill(pid, sig)
        t0 = time.monotonic()
        with pytest.raises(error, match=r"tile\(1,0\)"):
            _allreduce(wafer)
        assert time.monotonic() - t0 < WITHIN
        t0 = time.monotonic()
        with pytest.raises(error, match=r"tile\(1,0\)"):  # refused at once: the wafer lost a tile
            wafer.dsm.get("x")
        assert time.monotonic() - t0 < 1.0
    finally:
        if sig == signal.SIGSTOP:
            os.kill(pid, signal.SIGCONT)
        wafer.close()


def _decode_hit_by(llm: WaferLLM, sig: int, requests: list[GenRequest]):
    """Generate, and freeze or kill a tile the pipeline goes through once the first token is out."""
    victim = next(t for t in llm.placement.mesh.tiles() if t != llm.head)
    pid, hit = _pid(llm.wafer, victim), threading.Event()

    def on_token(i, token, finish):
        if not hit.is_set():
            hit.set()
            os.kill(pid, sig)

    try:
        return victim, llm.generate(requests, Sampler(), on_token)
    finally:
        if sig == signal.SIGSTOP:
            with contextlib.suppress(ProcessLookupError):  # (a recovery may have ended the frozen process)
                os.kill(pid, signal.SIGCONT)


def _tiny_llm() -> WaferLLM:
    config = tiny_config()
    placement = plan(config, TINY, MeshSpec(24, 8, 8, 8), kv=KVReserve(64, 2))
    return WaferLLM(config, synthetic_llama(config, seed=1), placement)


REQUESTS = [GenRequest((5, 6, 7), 40), GenRequest((9,), 40)]


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_a_decode_recovers_from_a_tile_frozen_or_killed_midway(ray_session, sig):
    """Nobody planned this fault: the decode finds the tile, restarts it and loses nothing."""
    with _tiny_llm() as llm:
        want, _ = llm.generate(REQUESTS, Sampler())
        t0 = time.monotonic()
        victim, (got, stats) = _decode_hit_by(llm, sig, REQUESTS)
        assert time.monotonic() - t0 < WITHIN + 15
    assert [c.tokens for c in got] == [c.tokens for c in want]
    (event,) = stats.faults
    assert event.kind == "tile" and event.where == str(victim) and event.recovered_at is not None


@pytest.mark.parametrize("sig,error", [(signal.SIGSTOP, TileStalled), (signal.SIGKILL, TileDied)])
def test_a_fail_fast_decode_stops_at_a_frozen_or_killed_tile(ray_session, sig, error):
    """Under a fail-fast plan the run ends within seconds naming the tile, with the tokens it had made."""
    with _tiny_llm() as llm, llm.faults(FaultPlan(policy="fail-fast")):
        t0 = time.monotonic()
        with pytest.raises(FaultStop) as err:
            _decode_hit_by(llm, sig, REQUESTS)
        assert time.monotonic() - t0 < WITHIN + 5
    assert isinstance(err.value.__cause__, error)
    victim = err.value.__cause__.tile
    assert str(victim) in str(err.value) and victim != llm.head
    got = err.value.completions
    assert sum(len(c.tokens) for c in got) >= 1 and all(len(c.tokens) < 40 for c in got)


def test_a_tiles_own_error_is_the_one_reported(ray_session):
    """A kernel that fails on one tile: its own error comes back, not the timeouts its neighbours saw."""
    with Wafer(spec="tiny", mesh=(6, 2), tile=(2, 2), launch=Launch(timeout=3.0)) as wafer:
        wafer.dsm.alloc("x", (2, 6, 1), split=("y", "x", None))

        def kernel(ctx):
            if ctx.local.x0 == 2:  # the middle tile fails before it sends anything
                raise ArithmeticError("the middle tile's own mistake")
            ctx.store("x", ctx.allreduce(ctx.load("x"), "x"))

        with pytest.raises(ArithmeticError, match="own mistake"):
            wafer.run(kernel)
        _allreduce(wafer)  # and the wafer is usable again
        np.testing.assert_array_equal(wafer.dsm.get("x"), np.zeros((2, 6, 1), np.float32))
