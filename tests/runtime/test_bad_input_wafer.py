"""Misusing an open Wafer's DSM and kernels raises an error that names the argument and the fix, leaves
nothing booked, and the wafer stays usable; a closed Wafer says it is closed (every entry point) and opens
again with an empty DSM; tiles placed on a Ray node the cluster lacks are refused, naming it. A 4x2 mesh in
two tile actors (spec tiny), on the session's Ray."""

from __future__ import annotations

import time

import numpy as np
import pytest

from waferrt.core.mesh import Region
from waferrt.runtime import UnknownTensor, Wafer, WaferClosed


@pytest.fixture(scope="module")
def wafer(ray_session):
    with Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2)) as w:
        w.dsm.alloc("x", (2, 4))
        yield w


F32 = np.zeros((2, 4), np.float32)
CASES = [
    ("negative shape", lambda w: w.dsm.alloc("y", (-4, 8)), ValueError, "shape (-4, 8): axis 0 has -4 elements"),
    ("zero shape", lambda w: w.dsm.alloc("y", (2, 0)), ValueError, "axis 1 has 0 elements"),
    ("shape not a tuple", lambda w: w.dsm.alloc("y", 8), TypeError, "a tensor's shape is a tuple"),
    ("name not a str", lambda w: w.dsm.alloc(7, (2, 4)), TypeError, "a DSM tensor's name is a non-empty str"),
    ("empty name", lambda w: w.dsm.alloc("", (2, 4)), TypeError, "non-empty str, got ''"),
    ("name taken", lambda w: w.dsm.alloc("x", (2, 4)), ValueError, "DSM tensor 'x' exists; free it first"),
    ("bfloat16 tensor", lambda w: w.dsm.alloc("y", (2, 4), dtype="bfloat16"), ValueError,
     "bfloat16 is a storage dtype of the decode only"),
    ("unknown dtype", lambda w: w.dsm.alloc("y", (2, 4), dtype="float31"), ValueError,
     "dtype 'float31' is not a numeric numpy dtype name"),
    ("region as a tuple", lambda w: w.dsm.alloc("y", (2, 4), region=(0, 0, 2, 2)), TypeError,
     "region must be a waferrt.Region"),
    ("region off the mesh", lambda w: w.dsm.alloc("y", (2, 4), region=Region(2, 0, 4, 2)), ValueError,
     "is outside the 4x2 mesh"),
    ("bad split", lambda w: w.dsm.alloc("y", (2, 4), split=("x", "x")), ValueError, "at most one tensor axis"),
    ("int64 into float32", lambda w: w.dsm.put("x", np.arange(8).reshape(2, 4)), TypeError,
     "DSM tensor 'x' holds float32 but the array is int64; cast it explicitly"),
    ("float64 into float32", lambda w: w.dsm.put("x", F32.astype(np.float64)), TypeError,
     "array.astype(np.float32)"),
    ("list into float32", lambda w: w.dsm.put("x", [[1.0] * 4] * 2), TypeError, "the array is float64"),
    ("wrong shape", lambda w: w.dsm.put("x", np.zeros((4, 2), np.float32)), ValueError,
     "DSM tensor 'x' has shape (2, 4) but the array has shape (4, 2)"),
    ("put unknown", lambda w: w.dsm.put("nope", F32), UnknownTensor, "no DSM tensor 'nope'; allocated: ['x']"),
    ("get unknown", lambda w: w.dsm.get("nope"), KeyError, "no DSM tensor 'nope'"),
    ("free unknown", lambda w: w.dsm.free("nope"), UnknownTensor, "no DSM tensor 'nope'"),
    ("read unknown", lambda w: w.dsm.read("nope", (0, 0)), UnknownTensor, "no DSM tensor 'nope'"),
    ("kernel not callable", lambda w: w.run("allreduce"), TypeError, "kernel must be a function kernel(ctx"),
    ("run off the mesh", lambda w: w.run(lambda ctx: None, region=Region(0, 0, 5, 2)), ValueError,
     "is outside the 4x2 mesh"),
    ("open twice", lambda w: w.open(), RuntimeError, "this Wafer is already open"),
]


@pytest.mark.parametrize("call, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_misuse_is_refused_and_the_wafer_stays_usable(wafer, call, error, words):
    t0 = time.monotonic()
    with pytest.raises(error) as e:
        call(wafer)
    assert words in str(e.value)
    assert time.monotonic() - t0 < 10.0
    assert sorted(wafer.dsm.layouts) == ["x"]
    assert {s["tensors"] for s in wafer.sram()} == {1}  # nothing else was booked on any tile
    wafer.dsm.put("x", np.arange(8, dtype=np.float32).reshape(2, 4))
    assert wafer.dsm.get("x").sum() == 28


CLOSED = [
    ("run", lambda w: w.run(lambda ctx: None)),
    ("alloc", lambda w: w.dsm.alloc("y", (2, 4))),
    ("put", lambda w: w.dsm.put("x", F32)),
    ("get", lambda w: w.dsm.get("x")),
    ("free", lambda w: w.dsm.free("x")),
    ("sram", lambda w: w.sram()),
]


@pytest.fixture(scope="module")
def closed(ray_session):
    w = Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2))
    with w:
        w.dsm.alloc("x", (2, 4))
    return w


@pytest.mark.parametrize("call", [c[1] for c in CLOSED], ids=[c[0] for c in CLOSED])
def test_a_closed_wafer_says_so(closed, call):
    with pytest.raises(WaferClosed, match=r"this Wafer is closed; open it again with `with wafer:` or wafer\.open\(\)"):
        call(closed)


def test_a_closed_wafer_opens_again_with_an_empty_dsm(closed):
    with closed as w:
        assert w.dsm.layouts == {}
        w.dsm.alloc("x", (2, 4))  # the name is free again: the tiles that held it are gone
        w.dsm.put("x", np.ones((2, 4), np.float32))
        w.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))
        np.testing.assert_array_equal(w.dsm.get("x"), np.full((2, 4), 4, np.float32))
    with pytest.raises(WaferClosed):
        closed.dsm.get("x")


def test_tiles_placed_on_a_node_the_cluster_lacks_are_refused_naming_it(ray_session):
    """A placement made for another cluster (or before a node went): NodesGone names the tiles and the node,
    says what to do, and nothing starts; the same Wafer then opens on this cluster's nodes."""
    from waferrt.actors.session import NodesGone
    from waferrt.core.mesh import TileId

    w = Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2))
    with pytest.raises(NodesGone, match=r"puts tile\(1,0\) on Ray node\(s\) 0123456789ab, which this cluster does "
                                        r"not have .*plan again on the cluster's nodes"):
        w.open(node_ids={TileId(1, 0): "0123456789ab" * 4})
    assert w.tiles == {}
    with w.open():
        assert len(w.tiles) == 2
