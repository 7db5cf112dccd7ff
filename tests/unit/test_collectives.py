"""Mesh primitives against numpy, run SPMD over tiles without Ray (waferrt.fabric.loop.simulate)."""

import numpy as np
import pytest

from waferrt.core.cost import (
    allreduce_cost,
    broadcast_cost,
    compute_cost,
    ktree_groups,
    ktree_plan,
    reduce_flops,
    shift_cost,
)
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.fabric.kernel import NotNeighbourError
from waferrt.fabric.loop import simulate

# (mesh w, h, tile w, h): 1x1, 1xN, Nx1, square with 2x2 tiles, non-square with 3x2 tiles, non-dividing
MESHES = [(1, 1, 1, 1), (8, 1, 3, 1), (1, 8, 1, 3), (8, 8, 4, 4), (9, 6, 3, 3), (7, 5, 4, 3)]
AXES = [("x", 1), ("y", 0)]


def _data(mesh, seed=0, block=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((mesh.height, mesh.width, block)).astype(np.float32)


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "{}x{}/{}x{}".format(*s))
@pytest.mark.parametrize("algo", ["ktree", "chain", "ring", "pipeline"])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce_matches_numpy(shape, algo, op):
    mesh = MeshSpec(*shape)
    x = _data(mesh)
    for axis, ax in AXES:
        out, _ = simulate(mesh, TINY, mesh.region, lambda ctx, a, axis=axis: ctx.allreduce(a, axis, algo, 2, op), a=x)
        ref = (np.sum if op == "sum" else np.max)(x, axis=ax, keepdims=True)
        np.testing.assert_allclose(out, np.broadcast_to(ref, x.shape), rtol=1e-5, atol=1e-5)
        assert out.dtype == np.float32


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "{}x{}/{}x{}".format(*s))
@pytest.mark.parametrize("wrap", [False, True])
def test_shift_and_broadcast_match_numpy(shape, wrap):
    mesh = MeshSpec(*shape)
    x = _data(mesh, 1)
    for axis, ax in AXES:
        for d in (1, -1):
            out, _ = simulate(mesh, TINY, mesh.region, lambda ctx, a, axis=axis, d=d: ctx.shift(a, axis, d, wrap), a=x)
            ref = np.roll(x, d, axis=ax)
            if not wrap:
                idx = [slice(None)] * 3
                idx[ax] = 0 if d == 1 else -1
                ref[tuple(idx)] = 0
            np.testing.assert_array_equal(out, ref)
        root = x.shape[ax] - 1
        kernel = lambda ctx, a, axis=axis, root=root: ctx.broadcast(a, axis, root)  # noqa: E731
        out, _ = simulate(mesh, TINY, mesh.region, kernel, a=x)
        np.testing.assert_array_equal(out, np.broadcast_to(np.take(x, [root], axis=ax), x.shape))


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "{}x{}/{}x{}".format(*s))
def test_gemv_alternates_axes(shape):
    """Two MeshGEMVs: x split over columns -> y split over rows -> z split over columns, no transpose."""
    mesh = MeshSpec(*shape)
    rng = np.random.default_rng(2)
    h, w = mesh.height, mesh.width
    ib, ob = 3, 4
    W1 = rng.standard_normal((h * ob, w * ib)).astype(np.float32)
    W2 = rng.standard_normal((w * ib, h * ob)).astype(np.float32)
    v = rng.standard_normal(w * ib).astype(np.float32)
    w1 = W1.reshape(h, ob, w, ib).transpose(0, 2, 1, 3)  # (rows, cols, out_b, in_b)
    w2 = W2.reshape(w, ib, h, ob).transpose(2, 0, 1, 3)
    xb = np.broadcast_to(v.reshape(1, w, ib), (h, w, ib)).copy()

    def kernel(ctx, a, b, x):
        y = ctx.gemv(a, x, "x")  # (rows, cols, ob): row r holds y[r*ob:(r+1)*ob]
        return ctx.gemv(b, y, "y")

    out, cost = simulate(mesh, TINY, mesh.region, kernel, a=w1, b=w2, x=xb)
    ref = (W2 @ (W1 @ v)).reshape(w, ib)
    np.testing.assert_allclose(out, np.broadcast_to(ref, (h, w, ib)), rtol=1e-4, atol=1e-4)
    assert cost["gemv"].flops == 2 * (2 * ib * ob) + reduce_flops("ktree", w, ob) + reduce_flops("ktree", h, ib)


@pytest.mark.parametrize("algo", ["ktree", "chain", "ring", "pipeline"])
@pytest.mark.parametrize("n,tile", [(64, 16), (64, 64), (10, 3), (2, 1), (27, 5)])
def test_allreduce_counts_equal_closed_forms(algo, n, tile):
    mesh = MeshSpec(n, 1, tile, 1)
    x = _data(mesh, 3, block=64)
    for k in (2, 3):
        _, cost = simulate(mesh, TINY, mesh.region, lambda ctx, a, k=k: ctx.allreduce(a, "x", algo, k), a=x)
        reductions = compute_cost(TINY, reduce_flops(algo, n, 64, k))  # the kernel context books them too
        assert cost[f"allreduce.{algo}"] == allreduce_cost(TINY, algo, n, 64 * 4, k) + reductions


def test_the_reductions_of_an_allreduce_are_the_busiest_cores():
    """ktree: a level's root combines each half's stream; ring: n-1 chunks of 1/n; pipeline: n chunks."""
    assert [reduce_flops("ktree", 4, 64, k) for k in (1, 2)] == [2 * 64, 2 * 64]  # k=1: both halves into core 2
    assert reduce_flops("ring", 4, 64) == 3 * 16 and reduce_flops("pipeline", 4, 64) == 4 * 16
    assert reduce_flops("ring", 1, 64) == 0


def test_closed_forms_scale_as_documented():
    n = 64
    ring = allreduce_cost(TINY, "ring", n, 4096)
    assert 2 * n <= ring.hops <= 4 * n and ring.stages == 2 * (n - 1)
    for k in (2, 3):
        kt = allreduce_cost(TINY, "ktree", n, 4096, k)
        g = ktree_groups(n, k)
        assert kt.stages <= k * (g - 1) + 1 and g <= int(np.ceil(n ** (1 / k))) + 1
    assert allreduce_cost(TINY, "ktree", n, 64).cycles < allreduce_cost(TINY, "ring", n, 64).cycles


def test_shift_and_broadcast_costs():
    mesh = MeshSpec(12, 1, 5, 1)
    x = _data(mesh, 4, block=8)
    for wrap in (False, True):
        _, cost = simulate(mesh, TINY, mesh.region, lambda ctx, a, wrap=wrap: ctx.shift(a, "x", 1, wrap), a=x)
        assert cost["shift"] == shift_cost(TINY, 12, 32, wrap)
    _, cost = simulate(mesh, TINY, mesh.region, lambda ctx, a: ctx.broadcast(a, "x", 0), a=x)
    assert cost["broadcast"] == broadcast_cost(TINY, 12, 32)


def test_non_neighbour_send_names_both_cores_and_the_rule():
    mesh = MeshSpec(4, 4, 2, 2)
    x = _data(mesh)
    with pytest.raises(NotNeighbourError, match=r"core \(x=0, y=0\) cannot send to core \(x=2, y=0\).*N/E/S/W"):
        simulate(mesh, TINY, Region(0, 0, 2, 2), lambda ctx, a: ctx.send(a, 2, 0), a=x[:2, :2])
    with pytest.raises(NotNeighbourError, match="2 hops apart"):
        simulate(mesh, TINY, Region(0, 0, 2, 2), lambda ctx, a: ctx.send(a, 1, 1), a=x[:2, :2])


def test_neighbour_send_moves_one_hop_across_tiles():
    mesh = MeshSpec(6, 4, 4, 3)
    x = _data(mesh)
    out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, a: ctx.send(a, 0, -1), a=x)
    ref = np.zeros_like(x)
    ref[:-1] = x[1:]
    np.testing.assert_array_equal(out, ref)
    assert cost["send"].hops == 1


def test_sub_region_spanning_tiles():
    mesh = MeshSpec(8, 8, 3, 3)
    region = Region(2, 1, 5, 6)
    x = _data(mesh)[1:7, 2:7]
    out, _ = simulate(mesh, TINY, region, lambda ctx, a: ctx.allreduce(a, "y", "ring"), a=x)
    np.testing.assert_allclose(out, np.broadcast_to(x.sum(0, keepdims=True), x.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["ktree", "chain", "ring", "pipeline"])
@pytest.mark.parametrize("shape", [(4, 4, 2, 2), (9, 3, 4, 2)], ids=["4x4/2x2", "9x3/4x2"])
def test_many_lines_book_each_line_as_the_closed_form(algo, shape):
    """Every row of cores is one line: same critical path, traffic times the number of rows."""
    mesh = MeshSpec(*shape)
    x = _data(mesh, 5)
    _, cost = simulate(mesh, TINY, mesh.region, lambda ctx, a: ctx.allreduce(a, "x", algo), a=x)
    got = cost[f"allreduce.{algo}"]
    want = allreduce_cost(TINY, algo, mesh.width, 4 * x.shape[2]) + compute_cost(TINY, reduce_flops(algo, mesh.width,
                                                                                                     x.shape[2]))
    assert (got.hops, got.stages, got.cycles) == (want.hops, want.stages, want.cycles)
    assert (got.link_bytes, got.messages) == (mesh.height * want.link_bytes, mesh.height * want.messages)


@pytest.mark.parametrize("g", [3, 4, 8, 27])
def test_ktree_roots_where_waferllm_puts_them(g):
    """MeshInfra/WaferLLM run_wse2.sh, g groups of g cores: root_1st_phase = g / 2, root_2nd_phase = (g / 2) * g
    + root_1st_phase; both halves of every group stream toward its root at once, the sum is multicast both ways."""
    n = g * g
    plan = ktree_plan(n, 2)
    assert ktree_groups(n, 2) == g and plan.root == (g // 2) * g + g // 2
    assert [len(level.steps) for level in plan.levels] == [g // 2, g // 2]
    assert {d for d, _ in plan.levels[0].steps[0]} == ({1, -1} if g > 2 else {1})
    cost = allreduce_cost(TINY, "ktree", n, 64)
    far = (g // 2) * g + g // 2
    assert cost.hops == g // 2 + (g // 2) * g + far and cost.stages == 2 * (g // 2) + 1
    chain = allreduce_cost(TINY, "chain", n, 64)
    assert (chain.hops, chain.stages) == (2 * (n - 1), n)  # the SDK's chain: 2N hops, N stages (paper sec. 7.3)
    assert chain.cycles > cost.cycles
