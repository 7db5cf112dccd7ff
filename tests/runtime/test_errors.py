"""Errors that teach, through the real Wafer: SRAM overflow and non-neighbour sends cross Ray as themselves.

A 4x2 mesh in two tile actors of 2x2 cores (spec tiny: 16 KB per core), on the session's Ray.
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.mesh import Coord, Region
from waferrt.core.sram import SramOverflow
from waferrt.fabric.kernel import NotNeighbourError
from waferrt.runtime import Launch, Wafer

SRAM = 16 * 1024


@pytest.fixture(scope="module")
def wafer(ray_session):
    with Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2)) as w:
        yield w


def booked(wafer: Wafer) -> dict[str, tuple[int, int]]:
    """tile -> (most bytes booked on one of its cores, tensors held)."""
    return {s["tile"]: (s["max"], s["tensors"]) for s in wafer.sram()}


def test_overflow_names_tensor_core_bytes_asked_and_free(wafer):
    with pytest.raises(SramOverflow) as err:
        wafer.dsm.alloc("too_big", (2, 4, 5000), split=("y", "x", None))  # 20000 bytes per core
    e = err.value
    assert (e.tensor, e.core, e.asked, e.free) == ("too_big", Coord(0, 0), 20000, SRAM)
    assert f"'too_big': core (x=0, y=0) was asked for 20000 bytes but has only {SRAM} of {SRAM}" in str(e)
    assert "too_big" not in wafer.dsm.layouts
    assert booked(wafer) == {"tile(0,0)": (0, 0), "tile(1,0)": (0, 0)}


def test_overflow_on_one_tile_leaves_no_booking_on_the_others(wafer):
    """The tensor fits on tile(1,0) but not on tile(0,0), which a first tensor half fills: the Wafer must
    undo tile(1,0)'s booking, and the freed memory must be usable again."""
    wafer.dsm.alloc("fill", (2, 2, 3000), region=Region(0, 0, 2, 2), split=("y", "x", None))
    try:
        with pytest.raises(SramOverflow, match=r"'half': core \(x=0, y=0\) was asked for 8000 bytes but has only "
                                               rf"{SRAM - 12000} of {SRAM} bytes free"):
            wafer.dsm.alloc("half", (2, 4, 2000), split=("y", "x", None))
        assert booked(wafer) == {"tile(0,0)": (12000, 1), "tile(1,0)": (0, 0)}
    finally:
        wafer.dsm.free("fill")
    wafer.dsm.alloc("half", (2, 4, 2000), split=("y", "x", None))
    assert booked(wafer) == {"tile(0,0)": (8000, 1), "tile(1,0)": (8000, 1)}
    wafer.dsm.free("half")


def test_non_neighbour_send_names_both_cores_and_the_rule(wafer):
    wafer.dsm.alloc("v", (2, 4, 3), split=("y", "x", None))
    try:
        with pytest.raises(NotNeighbourError, match=r"core \(x=\d, y=0\) cannot send to core \(x=\d, y=0\): they are 2 "
                                                    r"hops apart.*only to its N/E/S/W neighbours"):
            wafer.run(lambda ctx: ctx.send(ctx.load("v"), 2, 0))
        with pytest.raises(NotNeighbourError, match="2 hops apart"):
            wafer.run(lambda ctx: ctx.send(ctx.load("v"), 1, 1))
        # the wafer is still usable after the error
        x = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
        wafer.dsm.put("v", x)
        wafer.run(lambda ctx: ctx.store("v", ctx.send(ctx.load("v"), 1, 0)))
        ref = np.zeros_like(x)
        ref[:, 1:] = x[:, :-1]
        np.testing.assert_array_equal(wafer.dsm.get("v"), ref)
    finally:
        wafer.dsm.free("v")


def test_bad_requests_say_what_is_allowed(wafer):
    with pytest.raises(ValueError, match="outside the 4x2 mesh"):
        wafer.run(lambda ctx: None, region=Region(2, 0, 3, 2))
    with pytest.raises(KeyError, match="no DSM tensor 'nope'; allocated: none"):
        wafer.dsm.get("nope")
    wafer.dsm.alloc("t", (2, 4))
    try:
        with pytest.raises(ValueError, match="'t' exists; free it first"):
            wafer.dsm.alloc("t", (2, 4))
    finally:
        wafer.dsm.free("t")


def test_a_kernel_that_fails_on_one_tile_leaves_the_wafer_usable(ray_session):
    """Tile (0,0) raises after its first exchange; its neighbour gives up at the fabric deadline with an
    error naming the link; what the failed run left on the links is dropped, so the next run is exact."""
    def broken(ctx):
        a = ctx.shift(np.ones(ctx.shape + (3,), np.float32), "x", 1)
        if ctx.local.x0 == 0:
            raise ValueError("boom on the west tile")
        ctx.allreduce(a, "x")

    def fine(ctx):
        ctx.store("y", ctx.allreduce(ctx.load("x"), "x", "ring"))

    with Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), launch=Launch(timeout=2.0)) as w:
        x = np.arange(4 * 2 * 3, dtype=np.float32).reshape(2, 4, 3)
        for name in ("x", "y"):
            w.dsm.alloc(name, x.shape, split=("y", "x", None))
        w.dsm.put("x", x)
        with pytest.raises(ValueError, match="boom on the west tile"):
            w.run(broken)
        w.run(fine)
        np.testing.assert_allclose(w.dsm.get("y"), np.broadcast_to(x.sum(1, keepdims=True), x.shape))


def test_kernels_on_overlapping_regions_in_turn(ray_session):
    """Tiles that sat out a run still agree with the others on the next one (commands are numbered by
    the driver, not counted by each tile)."""
    with Wafer(spec="tiny", mesh=(6, 2), tile=(2, 2), launch=Launch(timeout=5.0)) as w:
        x = np.arange(6 * 2 * 2, dtype=np.float32).reshape(2, 6, 2)
        for name in ("x", "y"):
            w.dsm.alloc(name, x.shape, split=("y", "x", None))
        w.dsm.put("x", x)
        for x0, width in ((0, 4), (2, 4), (0, 6)):
            w.run(lambda ctx: ctx.store("y", ctx.allreduce(ctx.load("x"), "x")), region=Region(x0, 0, width, 2))
            want = x[:, x0:x0 + width].sum(1, keepdims=True)
            np.testing.assert_allclose(w.dsm.get("y")[:, x0:x0 + width], np.broadcast_to(want, (2, width, 2)))
