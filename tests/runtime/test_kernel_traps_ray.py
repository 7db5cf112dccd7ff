"""The kernel traps of issue 35 on Ray tile actors (their local-wafer twins: tests/unit/test_kernel_traps.py):
stderr printed in a kernel reaches the host, a corrupt link names the kernel's line and cores, and a tile that
never reaches a collective ends the run within the timeout (TileHung) instead of hanging."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

import waferrt
from waferrt import Coord, TileId
from waferrt.fabric.misuse import TileHung
from waferrt.faults import Corrupt, PayloadCorrupt


@pytest.fixture(scope="module")
def wafer(ray_session):
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), launch=waferrt.Launch(timeout=3)) as w:
        w.dsm.alloc("x", (2, 4))
        w.dsm.put("x", np.ones((2, 4), np.float32))
        yield w


def _chatty(ctx):
    print("on stdout")
    print("on stderr", file=sys.stderr)


def _row_sum(ctx):
    ctx.store("x", ctx.allreduce(ctx.load("x"), "x"))  # the line the corrupt payload names


def _stuck_west(ctx):
    while ctx.local.x0 == 0:  # never comes: the tile's actor is busy until the wafer closes
        time.sleep(0.01)
    ctx.allreduce(np.ones(ctx.shape + (1,), np.float32), "x")


def test_stderr_of_a_kernel_reaches_the_host_on_ray(wafer, capsys):
    wafer.run(_chatty)
    out = capsys.readouterr().out
    assert "[tile(0,0)] on stdout" in out and "[tile(1,0)] on stderr" in out


def test_a_corrupt_link_names_the_kernel_line_and_cores_on_ray(wafer):
    wafer.inject(Corrupt((1, 0), (2, 0)))
    with pytest.raises(PayloadCorrupt) as e:
        wafer.run(_row_sum)
    assert "# the line the corrupt payload names" in str(e.value) and e.value.core == Coord(2, 0)
    assert wafer.session.log.events[-1].detected_by == "kernel: PayloadCorrupt"


def test_a_tile_that_never_reaches_a_collective_ends_the_run_on_ray(wafer):  # last: the wafer is spent after
    start = time.monotonic()
    with pytest.raises(TileHung) as e:
        wafer.run(_stuck_west)
    assert time.monotonic() - start < 60  # two timeouts of 3 s, and the watch's slices; not forever
    assert e.value.tile == TileId(0, 0)
    with pytest.raises(TileHung):  # nothing more runs on it until it is opened again
        wafer.run(_row_sum)


def test_a_tile_crash_that_ends_the_kernel_is_logged_as_fired_and_found(ray_session):
    from waferrt.actors.watch import TileDied
    from waferrt.faults import TileCrash, Trigger

    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2)) as wafer:
        wafer.dsm.alloc("x", (2, 4))
        wafer.inject(TileCrash((1, 0), Trigger(step=1)))
        with pytest.raises(TileDied):
            wafer.run(_row_sum)
        (event,) = wafer.session.log.events
    assert event.step == 1 and event.outcome == "detected, not recovered" and event.detected_by == "host: TileDied"
