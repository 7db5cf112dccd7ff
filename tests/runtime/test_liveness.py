"""Frozen and dead tiles end a run within seconds, with an error that names the right tile.

SIGSTOP freezes a tile's process (its heartbeats stop, it answers nothing): ``wafer.run`` and
``WaferLLM.generate`` raise TileStalled naming it. SIGKILL kills a tile that is not the first one: they
raise TileDied naming it, well before any fabric deadline; the wafer then refuses further work at once,
and the tokens the decode had produced come with the error. Every case closes cleanly afterwards.
"""

from __future__ import annotations

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
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.runtime import STALL_S, Wafer
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
    wafer = Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), timeout=30.0).open()
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


@pytest.mark.parametrize("sig,error", [(signal.SIGSTOP, TileStalled), (signal.SIGKILL, TileDied)])
def test_a_decode_with_a_tile_frozen_or_killed_midway(ray_session, sig, error):
    cfg = tiny_config()
    placement = plan(cfg, TINY, MeshSpec(24, 8, 8, 8), kv=KVReserve(64, 2))
    requests = [GenRequest((5, 6, 7), 40), GenRequest((9,), 40)]
    llm = WaferLLM(cfg, synthetic_llama(cfg, seed=1), placement).__enter__()
    victim = next(t for t in placement.mesh.tiles() if t != llm.head)
    pid, hit = _pid(llm.wafer, victim), threading.Event()

    def on_token(i, token, finish):
        if not hit.is_set():
            hit.set()
            os.kill(pid, sig)  # the first token is out: freeze or kill a tile the pipeline goes through

    t0 = time.monotonic()
    try:
        with pytest.raises(error, match=str(victim).replace("(", r"\(").replace(")", r"\)")) as err:
            llm.generate(requests, Sampler(), on_token)
        assert time.monotonic() - t0 < WITHIN + 5
        got = err.value.completions
        assert sum(len(c.tokens) for c in got) >= 1 and all(len(c.tokens) < 40 for c in got)
    finally:
        if sig == signal.SIGSTOP:
            os.kill(pid, signal.SIGCONT)
        llm.close()


def test_a_tiles_own_error_is_the_one_reported(ray_session):
    """A kernel that fails on one tile: its own error comes back, not the timeouts its neighbours saw."""
    with Wafer(spec="tiny", mesh=(6, 2), tile=(2, 2), timeout=3.0) as wafer:
        wafer.dsm.alloc("x", (2, 6, 1), split=("y", "x", None))

        def kernel(ctx):
            if ctx.local.x0 == 2:  # the middle tile fails before it sends anything
                raise ArithmeticError("the middle tile's own mistake")
            ctx.store("x", ctx.allreduce(ctx.load("x"), "x"))

        with pytest.raises(ArithmeticError, match="own mistake"):
            wafer.run(kernel)
        _allreduce(wafer)  # and the wafer is usable again
        np.testing.assert_array_equal(wafer.dsm.get("x"), np.zeros((2, 6, 1), np.float32))
