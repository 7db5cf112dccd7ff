"""Faults seen by kernels, without Ray: the fault map, the kernel context's checks and ``where=``, a dead
core's lost DSM blocks on a tile (TileCores), a Corrupt caught by the checksum, and the example's fault-tolerant
allreduce against numpy on several meshes."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from waferrt.core.layout import Layout
from waferrt.core.mesh import Coord, MeshSpec, Region, TileId
from waferrt.core.spec import TINY
from waferrt.fabric.comm import Span
from waferrt.fabric.debug import KernelFailed
from waferrt.fabric.kernel import Context
from waferrt.fabric.loop import LoopFabric, simulate
from waferrt.faults import CoreFailed, CoreFailure, Corrupt, LinkFailed, LinkFailure, PayloadCorrupt, Trigger
from waferrt.faults.faultmap import FaultMap, lost_blocks
from waferrt.faults.state import FaultState
from waferrt.tiles import TileCores

ROOT = pathlib.Path(__file__).resolve().parents[2]
MESH = MeshSpec(4, 4, 2, 2)
C11 = Coord(1, 1)


def _dead(*cores, links=(), lost=()) -> FaultMap:
    return FaultMap(frozenset(cores), frozenset(frozenset(link) for link in links), tuple(lost))


def _x(mesh=MESH, block=3, seed=0):
    return np.random.default_rng(seed).standard_normal((mesh.height, mesh.width, block)).astype(np.float32)


def test_lost_blocks_name_the_tensor_and_the_indices_the_core_held():
    layouts = {"x": Layout((4, 8, 5), Region(0, 0, 4, 4), ("y", "x", None)),
               "far": Layout((2, 2), Region(2, 2, 2, 2), ("y", "x"))}
    assert lost_blocks(layouts, Coord(1, 2)) == ("DSM 'x' block [row 2, col 1] = x[2:3, 2:4, 0:5]",)
    assert lost_blocks(layouts, Coord(3, 3)) == ("DSM 'far' block [row 1, col 1] = far[1:2, 1:2]",
                                                 "DSM 'x' block [row 3, col 3] = x[3:4, 6:8, 0:5]")


def test_the_fault_map_joins_the_tiles_reports_and_finds_what_a_primitive_needs():
    m = FaultMap.join([{"cores": [C11], "links": [], "lost": [(C11, ("DSM 'x' block [row 1, col 1]",))]},
                       {"cores": [], "links": [(Coord(2, 0), Coord(3, 0))]}])
    assert m.cores == {C11} and not m.alive(C11) and m.alive(Coord(0, 0))
    assert not m.link_alive(Coord(3, 0), Coord(2, 0)) and m.region_links(MESH.region, "y") == []
    assert m.hit([Coord(0, 0), C11]) == CoreFailure(C11)
    assert m.hit([Coord(0, 0)], [(Coord(3, 0), Coord(2, 0))]) == LinkFailure(Coord(2, 0), Coord(3, 0))
    err = m.error(CoreFailure(C11), "somewhere")
    assert isinstance(err, CoreFailed) and "core (x=1, y=1) is dead (somewhere)" in str(err)
    assert "DSM 'x' block [row 1, col 1] (lost)" in str(err)


@pytest.mark.parametrize("call", ["allreduce", "shift", "broadcast", "send", "gemv"])
def test_a_primitive_that_needs_a_dead_core_raises_core_failed_naming_it_and_its_blocks(call):
    fm = _dead(C11, lost=[(C11, ("DSM 'x' block [row 1, col 1] = x[1:2, 1:2, 0:3]",))])
    kernels = {"allreduce": lambda ctx, a: ctx.allreduce(a, "y"), "shift": lambda ctx, a: ctx.shift(a, "x"),
               "broadcast": lambda ctx, a: ctx.broadcast(a, "y"), "send": lambda ctx, a: ctx.send(a, 0, 1),
               "gemv": lambda ctx, a: ctx.gemv(a[..., None, :], a, "x")}
    with pytest.raises(CoreFailed) as e:
        simulate(MESH, TINY, MESH.region, kernels[call], a=_x(), faults=fm)
    assert e.value.core == C11 and f"ctx.{call}" in str(e.value)
    assert "x[1:2, 1:2, 0:3] (lost)" in str(e.value)


def test_a_dead_link_fails_the_primitives_along_it_and_not_across():
    fm = _dead(links=[(Coord(1, 2), Coord(2, 2))])  # an E-W link between two tiles
    x = _x()
    with pytest.raises(LinkFailed, match=r"the link \(x=1, y=2\)-\(x=2, y=2\) is dead") as e:
        simulate(MESH, TINY, MESH.region, lambda ctx, a: ctx.allreduce(a, "x"), a=x, faults=fm)
    assert {e.value.a, e.value.b} == {Coord(1, 2), Coord(2, 2)}
    out, _ = simulate(MESH, TINY, MESH.region, lambda ctx, a: ctx.allreduce(a, "y"), a=x, faults=fm)
    np.testing.assert_allclose(out, np.broadcast_to(x.sum(0, keepdims=True), x.shape), atol=1e-5)


def test_send_where_sends_from_the_chosen_cores_only_and_books_their_messages():
    fm = _dead(C11)
    x = _x(block=1)

    def kernel(ctx, a):
        assert ctx.dead_cores == {C11} and ctx.dead_links == frozenset()
        return ctx.send(a, 1, 0, where=ctx.live & (ctx.coords()[0] != 0))  # all living but column 0

    out, cost = simulate(MESH, TINY, MESH.region, kernel, a=x, faults=fm)
    want = np.zeros_like(x)
    want[:, 2:] = x[:, 1:3]
    want[1, 2] = 0  # (1,1) is dead: it sent nothing
    np.testing.assert_array_equal(out, want)
    assert cost["send"].messages == 7  # columns 1 and 2 of 4 rows, less the dead core


@pytest.mark.parametrize("fault, error", [(_dead(C11), CoreFailed),
                                          (_dead(links=[(Coord(0, 1), C11)]), LinkFailed)])
def test_send_where_into_a_dead_core_or_over_a_dead_link_raises(fault, error):
    with pytest.raises(error, match=r"ctx.send E \(where=\)"):
        simulate(MESH, TINY, MESH.region, lambda ctx, a: ctx.send(a, 1, 0, where=ctx.coords()[0] == 0), a=_x(),
                 faults=fault, timeout=2)


def test_load_and_store_leave_a_dead_core_out_only_when_asked():
    layout = Layout((2, 2, 3), Region(0, 0, 2, 2), ("y", "x", None))
    blocks = np.arange(12, dtype=np.float32).reshape(2, 2, 1, 1, 3)
    store = {"x": (layout, blocks)}
    ctx = Context(Span.of(layout.region), _ledger(), store, faults=_dead(C11))
    with pytest.raises(CoreFailed, match="ctx.load of 'x'"):
        ctx.load("x")
    got = ctx.load("x", where=ctx.live)
    assert got[1, 1].sum() == 0 and (got[0, 0] == blocks[0, 0]).all()
    with pytest.raises(CoreFailed, match="ctx.store into 'x'"):
        ctx.store("x", got)
    ctx.store("x", got + 100, where=ctx.live)
    assert blocks[0, 1, 0, 0, 0] == 103 and blocks[1, 1, 0, 0, 0] == 9  # the dead core's block is untouched


def _ledger():
    from waferrt.core.ledger import Ledger

    return Ledger(TINY)


def test_a_tile_counts_kernel_commands_and_loses_a_dead_cores_blocks():
    mesh = MeshSpec(2, 2, 2, 2)
    tile = TileCores(mesh, TINY, TileId(0, 0))
    tile.links = LoopFabric(mesh).links(TileId(0, 0))  # one tile: its kernels send nothing
    tile.alloc("x", Layout((2, 2, 3), mesh.region, ("y", "x", None)))
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 1, 1, 3)
    tile.put("x", x)
    tile.inject(CoreFailure(C11, Trigger(step=2)), 0)
    assert tile.kernel_faults(1)["cores"] == []  # the first command: not yet
    report = tile.kernel_faults(2)
    assert report["cores"] == [C11] and report["lost"] == [(C11, ("DSM 'x' block [row 1, col 1] = x[1:2, 1:2, 0:3]",))]
    assert report["fired"][0]["step"] == 2
    with pytest.raises(CoreFailed, match=r"core \(x=1, y=1\) is dead .*x\[1:2, 1:2, 0:3\] \(lost\)"):
        tile.get("x")
    with pytest.raises(CoreFailed, match="wafer.dsm.read"):
        tile.read("x", 1, 1)
    tile.put("x", x + 1)  # the dead core's block can be put but never read back
    got = tile.get("x", fill=np.nan)
    assert np.isnan(got[1, 1]).all() and (got[0, 1] == x[0, 1] + 1).all()
    with pytest.raises(KernelFailed, match="ctx.allreduce along x") as e:  # the tile's error, on its way to the host
        tile.run(lambda ctx: ctx.allreduce(ctx.load("x", where=ctx.live), "x"), mesh.region, {}, 3,
                 FaultMap.join([report]))
    assert isinstance(e.value.unwrap(), CoreFailed) and e.value.unwrap().tile == TileId(0, 0)


def test_a_corrupt_kernel_message_is_caught_by_its_checksum_and_names_the_link():
    mesh = MeshSpec(4, 2, 2, 2)
    fabric = LoopFabric(mesh, timeout=2)
    state = FaultState(TileId(0, 0), mesh.tile_region(TileId(0, 0)))
    state.arm(Corrupt(Coord(1, 0), Coord(2, 0), bits=2), 0)
    state.tick(None)  # due at once: it flips the next message over its link
    fabric.links(TileId(0, 0)).corrupt = state.on_send
    x = _x(MeshSpec(4, 2, 2, 2))

    def body(t, links):
        local = mesh.tile_region(t)
        ctx = Context(Span(mesh.region, local, links), _ledger(), {}, tag="k1")
        return ctx.send(x[mesh.region.window(local)], 1, 0)

    with pytest.raises(PayloadCorrupt) as e:
        fabric.run_spmd(body)
    assert (e.value.receiver, e.value.sender, e.value.side) == (TileId(1, 0), TileId(0, 0), "W")
    assert "on the link from tile(0,0) (its W side) failed its checksum" in str(e.value)
    assert [r.fault for r in state.fired] == [Corrupt(Coord(1, 0), Coord(2, 0), bits=2)]


def _example():
    spec = importlib.util.spec_from_file_location("ft_allreduce", ROOT / "examples/fault_tolerant_allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape, dead, links", [
    ((8, 8, 4, 4), [(3, 4)], []),
    ((5, 3, 2, 2), [(1, 1), (3, 0)], [((0, 0), (1, 0))]),  # a dead root's neighbour link: around it
    ((7, 5, 4, 3), [(0, 0), (6, 4)], [((3, 2), (4, 2)), ((3, 1), (3, 2))]),  # the first core dead
    ((4, 4, 4, 4), [], []),
])
def test_the_examples_fault_tolerant_allreduce_sums_the_living_cores(shape, dead, links):
    tree_allreduce = _example().tree_allreduce
    mesh = MeshSpec(*shape)
    fm = _dead(*(Coord(*c) for c in dead), links=[(Coord(*a), Coord(*b)) for a, b in links])
    x = _x(mesh, block=2, seed=len(dead))
    live = np.ones(x.shape[:2], bool)
    for cx, cy in dead:
        live[cy, cx] = False
    out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, a: tree_allreduce(ctx, a), a=x, faults=fm)
    np.testing.assert_allclose(out[live], np.broadcast_to(x[live].sum(0), out[live].shape), atol=1e-5)
    assert cost["send"].messages == 2 * (live.sum() - 1)  # a tree: each living core but the root sends up once
