"""A GEMM's two backward products as mesh kernels (waferrt.kernels.gemm_backward), without Ray: dX = dY W^T and
dW = X^T dY equal numpy on square, non-square (its largest square), 1xN and Nx1 meshes of several tiles and
around a dead core and a dead link, with the operands where the forward MeshGEMM had them; what each books
equals its closed form (waferrt.core.train_cost) field by field."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.gemm_cost import GemmShape, gemm_cost
from waferrt.core.mesh import Coord, MeshSpec
from waferrt.core.spec import TINY, WSE2
from waferrt.core.train_cost import grad_costs, train_efficiency, train_gemm_costs
from waferrt.fabric.loop import simulate
from waferrt.faults.faultmap import FaultMap
from waferrt.kernels.gemm import Grid, place
from waferrt.kernels.gemm_backward import gather, grad_input, grad_weight, scatter

MESHES = [MeshSpec(4, 4, 2, 2), MeshSpec(6, 4, 4, 2), MeshSpec(5, 1, 2, 1), MeshSpec(1, 5, 1, 2),
          MeshSpec(3, 3, 3, 3), MeshSpec(5, 5, 2, 3)]
IDS = [f"{m.width}x{m.height}/{m.tile_w}x{m.tile_h}" for m in MESHES]


def _run(mesh: MeshSpec, mkn=(10, 12, 7), faults=None, seed=0):
    """X, W, dY, the grid, and the kernels' (dX, cost), (dW, cost)."""
    rng = np.random.default_rng(seed)
    m, k, n = mkn
    X, W, dY = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    fm = faults or FaultMap()
    grid = Grid.of(mesh.region, fm.cores, [tuple(link) for link in fm.links])
    x, w = place("meshgemm", grid, mesh.region, X, W)  # the forward's A and B layouts
    dy = scatter("C", grid, mesh.region, dY)  # where the forward left Y
    dx, cx = simulate(mesh, TINY, mesh.region, grad_input, faults=faults, dy=dy, w=w[:, :, 0])
    dw, cw = simulate(mesh, TINY, mesh.region, grad_weight, faults=faults, x=x[:, :, 0], dy=dy)
    return (X, W, dY), grid, (gather("A", grid, dx, m, k), cx), (gather("B", grid, dw, k, n), cw)


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_both_products_equal_numpy_and_book_their_closed_forms(mesh):
    (X, W, dY), grid, (dx, cx), (dw, cw) = _run(mesh)
    np.testing.assert_allclose(dx, dY @ W.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, X.T @ dY, rtol=1e-4, atol=1e-4)
    want_dx, want_dw = grad_costs(TINY, grid.shape(10, 12, 7))
    assert set(cx) == {"grad_input"} and set(cw) == {"grad_weight"}
    assert cx["grad_input"] == want_dx
    assert cw["grad_weight"] == want_dw


@pytest.mark.parametrize("dead", [dict(cores=[Coord(2, 1)]), dict(links=[(Coord(1, 2), Coord(2, 2))])],
                         ids=["inner-core", "a-link"])
def test_both_products_route_around_the_dead(dead):
    mesh = MeshSpec(6, 4, 4, 2)
    faults = FaultMap(frozenset(dead.get("cores", ())), frozenset(frozenset(x) for x in dead.get("links", ())))
    (X, W, dY), grid, (dx, cx), (dw, cw) = _run(mesh, faults=faults)
    assert len(grid.rows) == 3 and 2 not in (grid.cols if dead.get("cores") else grid.rows)  # the dead line left out
    np.testing.assert_allclose(dx, dY @ W.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, X.T @ dY, rtol=1e-4, atol=1e-4)
    want_dx, want_dw = grad_costs(TINY, grid.shape(10, 12, 7))
    assert (cx["grad_input"].flops, cw["grad_weight"].flops) == (want_dx.flops, want_dw.flops)


def test_the_closed_forms_by_hand():
    """4 x 4 cores, m = k = n = 8: 2 x 2 blocks, 16 bytes each; 4 steps of 2*2*2*2 = 16 flops; the
    accumulators move 4 times, the moving operand 3 times, every core's block one place at once (16
    messages, each ring of 4 places 2*(4-1) = 6 hops in all: 4 lines * 6 hops * 16 bytes per operand)."""
    dx, dw = grad_costs(TINY, GemmShape(8, 8, 8, 4, 4))
    for c in (dx, dw):
        assert (c.flops, c.stages, c.messages, c.link_bytes) == (4 * 16, 4, 4 * 16 + 3 * 16, 7 * 4 * 6 * 16)
        assert c.hops == 4 * 2  # every move of MeshGEMM's interleaved ring at most two hops
    fwd = gemm_cost(TINY, "meshgemm", GemmShape(8, 8, 8, 4, 4))
    assert fwd.flops == dx.flops and dx.cycles > fwd.cycles  # the forward's work, one move more


def test_train_efficiency_is_below_one_and_grows_with_the_blocks():
    small, big = (train_efficiency(WSE2, GemmShape(t, 4096, 4096, 600, 600)) for t in (2048, 16384))
    assert 0 < small["step"] < big["step"] < 1
    assert small["forward"] > small["grad_input"]  # the backward moves one block more per step
    assert set(train_gemm_costs(WSE2, GemmShape(64, 64, 64, 8, 8))) == {"forward", "grad_input", "grad_weight"}


def test_a_row_of_cores_sums_its_partial_dx_around_the_ring_by_hand():
    """1 x 4 cores, m = k = 8, n = 4: one step (gcd 1) of a whole (8, 8) x (8, 1) product per core; dX's (8, 8)
    partial sums then pass around the row's ring 3 times (256 bytes each, 4 messages of the ring's 6 hops in
    all), 3 adds of 64 values; dW's (8, 1) accumulators have a ring of 1 and move nowhere."""
    dx, dw = grad_costs(TINY, GemmShape(8, 8, 4, 1, 4))
    assert dx.flops == 2 * 8 * 8 * 1 + 3 * 64 and dx.stages == 1 + 3
    assert (dx.messages, dx.link_bytes) == (4 * 4, 4 * 6 * 256)
    assert (dw.flops, dw.stages, dw.messages) == (2 * 8 * 8 * 1, 0, 0)
