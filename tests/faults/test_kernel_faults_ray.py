"""Faults in kernels run with ``wafer.run`` on local Ray: a core dying at the kernel command its trigger
counts, seen alike by every tile (the plain kernel fails naming the core and its lost DSM blocks, the
example's fault-tolerant allreduce routes around it), a dead link between two tiles, and a corrupted
message between two tiles caught by its checksum and never used. One wafer of 8x4 cores in four tiles of
4x2; each test has its own faults and runs its kernels on a region that holds no other test's faults."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import waferrt
from waferrt.core.mesh import Coord, Region, TileId
from waferrt.faults import CoreFailed, CoreFailure, Corrupt, LinkFailed, LinkFailure, PayloadCorrupt, Trigger

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wafer(ray_session):
    with waferrt.Wafer(spec="tiny", mesh=(8, 4), tile=(4, 2), launch=waferrt.Launch(timeout=10)) as w:
        yield w


def _tensors(wafer, names, region: Region, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((region.h, region.w, 4)).astype(np.float32)
    for n in names:
        wafer.dsm.alloc(n, x.shape, region, split=("y", "x", None))
    wafer.dsm.put(names[0], x)
    return x


def _example():
    spec = importlib.util.spec_from_file_location("ft_example", ROOT / "examples/fault_tolerant_allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_core_dies_at_its_step_and_the_fault_tolerant_kernel_routes_around_it(wafer):
    ex, top = _example(), Region(0, 0, 8, 2)
    x = _tensors(wafer, ("a", "a_sum"), top, 1)
    wafer.inject(CoreFailure((5, 1), Trigger(step=2)))  # counted on tile(1,0): its 2nd kernel command
    wafer.run(ex.allreduce_2d, top, src="a", dst="a_sum")
    np.testing.assert_allclose(wafer.dsm.get("a_sum"), np.broadcast_to(x.sum((0, 1)), x.shape), atol=1e-4)
    with pytest.raises(CoreFailed) as e:
        wafer.run(ex.allreduce_2d, top, src="a", dst="a_sum")
    assert e.value.core == Coord(5, 1) and "DSM 'a' block [row 1, col 5] = a[1:2, 5:6, 0:4]" in e.value.lost
    assert wafer.fault_map().cores == {Coord(5, 1)}
    with pytest.raises(CoreFailed, match=r"DSM 'a_sum' block \[row 1, col 5\]"):
        wafer.dsm.get("a_sum")
    wafer.run(ex.ft_allreduce, top, src="a", dst="a_sum")
    live = np.ones(x.shape[:2], bool)
    live[1, 5] = False
    got = wafer.dsm.get("a_sum", fill=np.nan)
    np.testing.assert_allclose(got[live], np.broadcast_to(x[live].sum(0), got[live].shape), atol=1e-4)
    event = next(e for e in wafer.session.log.events if e.kind == "core")
    assert (event.step, event.detected_by) == (2, "kernel: CoreFailed")


def test_a_dead_link_between_two_tiles_fails_the_kernels_that_cross_it_and_no_other(wafer):
    bottom = Region(0, 2, 8, 2)
    x = _tensors(wafer, ("b", "b_sum"), bottom, 2)
    wafer.inject(LinkFailure((3, 2), (4, 2)))
    with pytest.raises(LinkFailed, match=r"the link \(x=3, y=2\)-\(x=4, y=2\) is dead"):
        wafer.run(lambda ctx: ctx.store("b_sum", ctx.allreduce(ctx.load("b"), "x")), bottom)
    wafer.run(lambda ctx: ctx.store("b_sum", ctx.allreduce(ctx.load("b"), "y")), bottom)
    np.testing.assert_allclose(wafer.dsm.get("b_sum"), np.broadcast_to(x.sum(0, keepdims=True), x.shape), atol=1e-5)


def test_a_corrupted_kernel_message_is_caught_by_its_checksum_and_never_used(wafer):
    left = Region(0, 0, 4, 4)  # tiles (0,0) above (0,1)
    x = _tensors(wafer, ("c", "c_next"), left, 3)
    wafer.inject(Corrupt((1, 1), (1, 2), bits=3))  # the next message tile(0,0) sends south
    south = lambda ctx: ctx.store("c_next", ctx.send(ctx.load("c"), 0, 1))  # noqa: E731
    with pytest.raises(PayloadCorrupt) as e:
        wafer.run(south, left)
    assert (e.value.receiver, e.value.sender, e.value.side) == (TileId(0, 1), TileId(0, 0), "N")
    assert not wafer.dsm.get("c_next")[2:].any()  # the receiving tile stored nothing
    wafer.run(south, left)  # the fault fired once: the same kernel again is right
    want = np.zeros_like(x)
    want[1:] = x[:-1]
    np.testing.assert_array_equal(wafer.dsm.get("c_next"), want)
    event = next(e for e in wafer.session.log.events if e.kind == "corrupt")
    assert event.detected_by == "kernel: PayloadCorrupt"
