"""Topologies (core.topology): the routes by hand, the closed forms of core.cost over each, and the emulator's
fabric booking those routes -- a torus's wrap links, a mesh-switch's switch -- and refusing a link the
topology does not have."""

import numpy as np
import pytest

from waferrt.core.cost import allreduce_cost, broadcast_cost, compute_cost, line_alltoall_cost, reduce_flops, shift_cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.core.topology import MESH, NoSuchLink, Topology, alltoall_load, routed_load
from waferrt.fabric.comm import LineComm, Span
from waferrt.fabric.loop import simulate

TORUS, SWITCH = Topology("torus"), Topology("mesh-switch", group=4)
TOPOLOGIES = [MESH, TORUS, SWITCH]
MESHES = [(8, 1, 3, 1), (1, 8, 1, 3), (8, 8, 4, 4), (9, 6, 3, 3), (7, 5, 4, 3)]


def test_routes_by_hand():
    assert [TORUS.line_hops(8, 0, b) for b in range(8)] == [0, 1, 2, 3, 4, 3, 2, 1]
    # mesh-switch, groups of 4: ports 2, 6, 10, 14; 0 -> 13 is 2 hops to port 2, 2 through the switch, 1 back
    assert SWITCH.port(0) == 2 and SWITCH.port(13) == 14 and SWITCH.line_hops(16, 0, 13) == 5
    assert SWITCH.line_hops(16, 0, 3) == 3  # inside one group: the mesh
    assert (MESH.farthest(10, 3), TORUS.farthest(10, 3), TORUS.farthest(9, 0)) == (6, 5, 4)
    assert MESH.ring_hops(10) == (2, 18) and TORUS.ring_hops(10) == (1, 10)
    assert MESH.on_line(True) == MESH and TORUS.on_line(False) == MESH and TORUS.on_line(True) == TORUS


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 16, 33])
def test_the_alltoall_closed_forms_are_the_routes_counted(topology, n):
    assert alltoall_load(topology, n) == routed_load(topology, n)


def test_the_alltoall_by_hand():
    """A line of 4: the mesh's middle link carries 2x2 chunks; a torus's forward links 1+2 (the tie forward)."""
    assert alltoall_load(MESH, 4).busiest == 4 and alltoall_load(TORUS, 4).busiest == 3
    spec = TINY.replace(topology=TORUS)
    c = line_alltoall_cost(spec, 4, 64)  # chunks of 16 bytes: the busiest link serialises 3 x 16 bytes
    assert (c.hops, c.messages) == (2, 12) and c.cycles == 2 * 1.0 + 8.0 + 3 * 16 / 4.0


def test_the_mesh_figures_are_unchanged():
    """The spec's default topology is the mesh: what the closed forms said before topologies existed."""
    assert shift_cost(TINY, 12, 32, True).hops == 11 and allreduce_cost(TINY, "ring", 10, 400).hops == 36
    assert broadcast_cost(TINY, 10, 8, 3).hops == 6


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "{}x{}/{}x{}".format(*s))
@pytest.mark.parametrize("topology", [TORUS, SWITCH], ids=str)
def test_a_kernel_books_its_topologys_routes(shape, topology):
    """Shift (with wrap), broadcast and every allreduce on a torus / mesh-switch Wafer: the right numbers, and
    the counts the closed forms over the same topology give, line by line."""
    mesh, spec = MeshSpec(*shape), TINY.replace(topology=topology)
    x = np.random.default_rng(0).standard_normal((mesh.height, mesh.width, 8)).astype(np.float32)
    for axis, ax in (("x", 1), ("y", 0)):
        n, lines = x.shape[ax], x.shape[1 - ax]
        out, cost = simulate(mesh, spec, mesh.region, lambda ctx, a, axis=axis: ctx.shift(a, axis, 1, True), a=x)
        np.testing.assert_array_equal(out, np.roll(x, 1, axis=ax))
        want = shift_cost(spec, n, 32, True)
        assert (cost["shift"].hops, cost["shift"].link_bytes) == (want.hops, lines * want.link_bytes)
        _, cost = simulate(mesh, spec, mesh.region, lambda ctx, a, axis=axis: ctx.broadcast(a, axis, 0), a=x)
        assert cost["broadcast"].hops == broadcast_cost(spec, n, 32).hops
        for algo in ("ktree", "ring", "pipeline"):
            out, cost = simulate(mesh, spec, mesh.region, lambda ctx, a, axis=axis, algo=algo: ctx.allreduce(
                a, axis, algo), a=x)
            np.testing.assert_allclose(out, np.broadcast_to(x.sum(ax, keepdims=True), x.shape), rtol=1e-5, atol=1e-5)
            got = cost[f"allreduce.{algo}"]
            want = allreduce_cost(spec, algo, n, 32) + compute_cost(spec, reduce_flops(algo, n, 8))
            assert (got.hops, got.stages, got.cycles) == (want.hops, want.stages, want.cycles)
            assert (got.link_bytes, got.messages) == (lines * want.link_bytes, lines * want.messages)


def test_the_torus_is_faster_where_it_should_be():
    torus = TINY.replace(topology=TORUS)
    assert shift_cost(torus, 64, 32, True).hops == 1 and broadcast_cost(torus, 64, 32).hops == 32
    assert allreduce_cost(torus, "ring", 64, 4096).cycles < allreduce_cost(TINY, "ring", 64, 4096).cycles
    switch = TINY.replace(topology=Topology("mesh-switch", 8))
    assert line_alltoall_cost(switch, 256, 4096).hops < line_alltoall_cost(TINY, 256, 4096).hops


def test_a_wrap_send_goes_over_the_torus_wrap_link_in_one_hop():
    mesh, torus = MeshSpec(6, 4, 4, 3), TINY.replace(topology=TORUS)
    x = np.arange(24, dtype=np.float32).reshape(4, 6, 1)
    out, cost = simulate(mesh, torus, mesh.region, lambda ctx, a: ctx.send(a, -1, 0, wrap=True), a=x)
    np.testing.assert_array_equal(out, np.roll(x, -1, axis=1))
    assert cost["send"].hops == 1 and cost["send"].messages == 24


@pytest.mark.parametrize("spec,region,step,match", [
    (TINY, Region(0, 0, 6, 4), (1, 0), r"core \(x=5, y=0\) has no link to core \(x=0, y=0\) on a mesh line of 6 cores"),
    (TINY.replace(topology=TORUS), Region(1, 0, 4, 4), (1, 0),
     r"core \(x=4, y=0\) has no link to core \(x=1, y=0\) on a mesh line of 4 cores"),
    (TINY.replace(topology=TORUS), Region(0, 1, 6, 3), (0, 1),
     r"core \(x=0, y=3\) has no link to core \(x=0, y=1\) on a mesh line of 3 cores"),
], ids=["mesh", "torus-narrow-region", "torus-short-column"])
def test_a_send_over_a_missing_link_names_the_cores(spec, region, step, match):
    mesh = MeshSpec(6, 4, 4, 3)
    x = np.zeros(region.shape + (1,), np.float32)
    with pytest.raises(NoSuchLink, match=match):
        simulate(mesh, spec, region, lambda ctx, a: ctx.send(a, *step, wrap=True), a=x)


def test_a_torus_wafer_runs_a_kernel_with_its_own_routing():
    """``Wafer(spec=...torus)``: a ring allreduce and a wrap shift over the wrap links, booked as the closed
    forms over the torus say (and fewer hops than the same kernel on a mesh Wafer)."""
    import waferrt

    def kernel(ctx):
        x = ctx.load("x")
        ctx.store("x", ctx.allreduce(ctx.shift(x, "x", 1, wrap=True), "y", algo="ring"))

    costs = {}
    for topology in (MESH, TORUS):
        spec = TINY.replace(topology=topology)
        with waferrt.Wafer(spec=spec, mesh=(6, 4), tile=(3, 2), backend="local") as wafer:
            wafer.dsm.alloc("x", (4, 6))
            x = np.arange(24, dtype=np.float32).reshape(4, 6)
            wafer.dsm.put("x", x)
            costs[topology.kind] = cost = wafer.run(kernel)
            np.testing.assert_array_equal(wafer.dsm.get("x"), np.broadcast_to(np.roll(x, 1, 1).sum(0), (4, 6)))
        assert cost["shift"].hops == shift_cost(spec, 6, 4, True).hops
        assert cost["allreduce.ring"].hops == allreduce_cost(spec, "ring", 4, 4).hops
    assert costs["torus"]["shift"].hops == 1 < costs["mesh"]["shift"].hops == 5


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
def test_a_spec_keeps_its_topology_through_json_and_a_mesh_spec_its_old_form(topology):
    import json

    from waferrt.core.spec import HardwareSpec

    spec = TINY.replace(topology=topology)
    assert HardwareSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
    assert ("topology" in spec.as_dict()) == (topology != MESH)  # a placement's JSON of a mesh is unchanged


def test_a_torus_line_wraps_only_when_it_is_a_whole_line_of_the_wafer():
    """HardwareSpec.on_line, the one owner the tiles' lines and decode.cost's line reduces ask: on TINY's 64x64
    torus a row of 64 cores wraps (0 -> 63 is one hop over the wrap link), a region's row of 8 does not (7 hops
    along the mesh), nor does a column of 8 unless the wafer is 8 tall (a kernel Span's `wafer`)."""
    spec = TINY.replace(topology=TORUS)
    assert spec.on_line("x", 64).topology.line_hops(64, 0, 63) == 1
    assert spec.on_line("x", 8).topology.line_hops(8, 0, 7) == 7
    assert spec.on_line("y", 8).topology == MESH and spec.on_line("y", 8, wafer=8).topology == TORUS
    assert TINY.on_line("x", 64) is TINY  # a mesh is a mesh on every line
    wide, narrow = (LineComm("x", Span.of(Region(0, 0, w, 2)), Ledger(spec)) for w in (64, 8))
    assert (wide.topo, narrow.topo) == (TORUS, MESH)
