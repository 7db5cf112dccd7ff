"""The kernel API's traps that a user hit (issue 35), each closed: a replicated tensor whose copies differ, a
keyword of Launch given to Wafer, ... -- each raises an error that says what to write instead."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import waferrt
from waferrt import Coord, TileId
from waferrt.dsm import CopiesDiffer
from waferrt.fabric.kernel import NotNeighbourError
from waferrt.fabric.misuse import BlockTooLarge, NeighbourTimeout, NotSpmd, TileHung
from waferrt.faults import Corrupt, PayloadCorrupt


def _rows_store_their_y(ctx):
    _, ys = ctx.coords()
    ctx.store("v", ctx.load("v") + ys[..., None].astype(np.float32))  # every row of cores a different value


def test_the_copies_of_a_replicated_tensor_must_agree_or_one_is_chosen():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.dsm.alloc("v", (8,), split=("x",))                        # split along x, a copy on each row
        wafer.dsm.put("v", np.zeros(8, np.float32))
        assert (wafer.dsm.get("v") == 0).all()                         # copies agree: read as before
        wafer.run(_rows_store_their_y)
        with pytest.raises(CopiesDiffer) as e:
            wafer.dsm.get("v")
        assert "core (x=0, y=1)'s copy" in str(e.value) and "core (x=0, y=0)'s" in str(e.value)
        assert "copy=(0, 1)" in str(e.value) and "(by up to 1)" in str(e.value)  # row 1 stored 1, row 0 kept 0
        assert (wafer.dsm.get("v", copy=(3, 1)) == 1).all() and (wafer.dsm.get("v", copy=(0, 0)) == 0).all()
        with pytest.raises(ValueError, match=r"copy=\(9, 0\) is not a core"):
            wafer.dsm.get("v", copy=(9, 0))


def test_a_split_tensor_has_no_copies_to_compare():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.dsm.alloc("v", (2, 4))
        wafer.dsm.put("v", np.arange(8, dtype=np.float32).reshape(2, 4))
        wafer.run(lambda ctx: ctx.store("v", ctx.load("v") + ctx.coords()[1][..., None, None]))
        assert wafer.dsm.get("v").tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]


@pytest.mark.parametrize("keyword, hint", [
    ("timeout", "write Wafer(..., launch=waferrt.Launch(timeout=5))"),
    ("max_tiles", "launch=waferrt.Launch(max_tiles=5)"),
    ("timout", "Wafer takes spec, mesh, tile, backend and launch"),
])
def test_a_keyword_wafer_does_not_take_is_named_with_where_it_goes(keyword, hint):
    with pytest.raises(TypeError) as e:
        waferrt.Wafer(backend="local", **{keyword: 5})
    assert f"unknown keyword(s) {keyword}" in str(e.value) and hint in str(e.value)


# -- blame: the tile at fault is the one named --------------------------------------------------------------
def _west(ctx) -> bool:
    return ctx.local.x0 == 0


def _ones(ctx):
    return np.ones(ctx.shape + (1,), np.float32)


def _run(kernel, timeout: float = 3.0, mesh=(4, 2)):
    with waferrt.Wafer(spec="tiny", mesh=mesh, tile=(2, 2), backend="local",
                       launch=waferrt.Launch(timeout=timeout)) as wafer:
        return wafer.run(kernel)


def test_a_tile_slower_than_the_timeout_is_blamed_not_the_one_that_waited():
    def slow_west(ctx):
        if _west(ctx):
            time.sleep(1.6)  # past the timeout (1 s), within the second one the host gives it after
        ctx.allreduce(_ones(ctx), "x")

    # on a loaded machine the slow tile may also miss the second second: then it is TileHung, blamed the same
    with pytest.raises((NeighbourTimeout, TileHung)) as e:
        _run(slow_west, timeout=1.0)
    assert e.value.tile == TileId(0, 0)
    text = "\n".join([str(e.value), *e.value.__notes__])
    assert "tile(0,0) was too slow: tile(1,0) waited" in text and "Launch(timeout=" in text


def test_a_tile_that_never_reaches_the_collective_ends_the_run_within_the_timeout():
    stop = threading.Event()

    def stuck_west(ctx):
        while _west(ctx) and not stop.is_set():  # never comes (until the test lets the thread go)
            time.sleep(0.01)
        ctx.allreduce(_ones(ctx), "x")

    start = time.monotonic()
    try:
        with pytest.raises(TileHung) as e:
            _run(stuck_west, timeout=0.5)
    finally:
        stop.set()
    assert time.monotonic() - start < 30  # not forever: two timeouts and the wafer's close
    assert e.value.tile == TileId(0, 0) and "tile(0,0) did not finish its command" in str(e.value)
    assert any("tile(1,0) waited for it at ctx.allreduce along x" in n for n in e.value.__notes__)


def test_tiles_that_disagree_on_the_axis_are_told_what_each_ran():
    def axis_by_tile(ctx):
        ctx.allreduce(_ones(ctx), "x" if _west(ctx) else "y")

    with pytest.raises(NotSpmd) as e:
        _run(axis_by_tile, mesh=(4, 4))
    assert "ran ctx.allreduce along x" in str(e.value) and "ran ctx.allreduce along y" in str(e.value)
    assert "ended the kernel without it" not in str(e.value)


def test_a_send_under_an_if_points_at_the_send():
    def send_west_only(ctx):
        if _west(ctx):
            ctx.send(_ones(ctx), 1, 0)  # the line the error must point at

    with pytest.raises(NotSpmd) as e:
        _run(send_west_only)
    assert e.value.kernel_site.code == "ctx.send(_ones(ctx), 1, 0)  # the line the error must point at"


def test_a_send_to_a_far_core_names_the_core():
    with pytest.raises(NotNeighbourError) as e:
        _run(lambda ctx: ctx.send(_ones(ctx), 2, 0))
    assert e.value.core in (Coord(0, 0), Coord(2, 0)) and f"core {e.value.core} cannot send" in str(e.value)


# -- what reaches the host, what is refused -----------------------------------------------------------------
def test_what_a_kernel_prints_to_stderr_reaches_the_host_labelled(capsys):
    def chatty(ctx):
        print("on stdout")
        print("on stderr", file=sys.stderr)

    _run(chatty)
    out = capsys.readouterr().out
    assert "[tile(0,0)] on stdout" in out and "[tile(1,0)] on stderr" in out


def test_a_large_host_array_as_a_kernel_argument_is_refused_with_a_hint_at_the_dsm():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.run(lambda ctx, w: None, w=np.zeros(256, np.float32))  # 1,024 bytes: a small value is fine
        with pytest.raises(ValueError) as e:
            wafer.run(lambda ctx, w: None, w=np.zeros(1 << 20, np.float32))
    assert "argument w= holds 4,194,304 bytes" in str(e.value) and "wafer.dsm.put('w', array)" in str(e.value)


# -- faults that fire, and say what they did ----------------------------------------------------------------
def test_a_corrupt_link_fires_on_the_local_wafer_and_names_the_kernel_line_and_cores():
    def row_sum(ctx):
        ctx.store("x", ctx.allreduce(ctx.load("x"), "x"))  # the line the error names

    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.dsm.alloc("x", (2, 4))
        wafer.dsm.put("x", np.ones((2, 4), np.float32))
        wafer.inject(Corrupt((1, 0), (2, 0)))
        with pytest.raises(PayloadCorrupt) as e:
            wafer.run(row_sum)
        (event,) = wafer.session.log.events
    text = str(e.value)
    assert "the payload of ctx.allreduce along x at " in text and "# the line the error names" in text
    assert "from cores (x=1, y=0)..(x=1, y=1) to cores (x=2, y=0)..(x=2, y=1)" in text
    assert e.value.tile == TileId(1, 0) and e.value.core == Coord(2, 0)
    assert event.step == 1 and event.detected_by == "kernel: PayloadCorrupt"  # it fired, and was caught


def _shift_floats(ctx, n):
    ctx.shift(np.zeros(ctx.shape + (n,), np.float32), "x")


def test_a_message_must_fit_beside_what_a_core_already_holds():
    with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2), backend="local") as wafer:
        wafer.dsm.alloc("resident", (2, 4, 3072), split=("y", "x", None))      # 12 KB of a 16 KB core
        wafer.run(_shift_floats, n=1024)                                       # 4 KB: fits beside it
        with pytest.raises(BlockTooLarge) as e:
            wafer.run(_shift_floats, n=2048)                                   # 8 KB does not
    assert "8,192 bytes" in str(e.value) and "4,096 bytes a core has free" in str(e.value)
    assert "already hold 12,288 of its 16,384 bytes" in str(e.value)
