"""The three mesh GEMMs (waferrt.kernels.gemm) without Ray: each equals numpy on square, non-square, 1xN and
Nx1 meshes of several tiles and around dead cores and links; what each books equals its closed form
(waferrt.core.gemm_cost) field by field; MeshGEMM's moves are never longer than two hops."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.cost import Cost
from waferrt.core.gemm_cost import GEMM_ALGOS, GemmShape, efficiency, gemm_cost, ring_hops
from waferrt.core.mesh import Coord, MeshSpec
from waferrt.core.spec import TINY, WSE2
from waferrt.fabric.loop import simulate
from waferrt.faults.faultmap import FaultMap
from waferrt.kernels.gemm import KERNELS, Grid, collect, place, ring

MESHES = [MeshSpec(4, 4, 2, 2), MeshSpec(6, 4, 4, 2), MeshSpec(5, 1, 2, 1), MeshSpec(1, 5, 1, 2),
          MeshSpec(3, 3, 3, 3), MeshSpec(2, 2, 1, 1)]
IDS = [f"{m.width}x{m.height}/{m.tile_w}x{m.tile_h}" for m in MESHES]


def _run(mesh: MeshSpec, algo: str, mkn=(10, 12, 7), faults=None, seed=0):
    rng = np.random.default_rng(seed)
    m, k, n = mkn
    A = rng.standard_normal((m, k)).astype(np.float32)
    B = rng.standard_normal((k, n)).astype(np.float32)
    region = mesh.region
    fm = faults or FaultMap()
    grid = Grid.of(region, fm.cores, [tuple(link) for link in fm.links])
    a, b = place(algo, grid, region, A, B)
    c, cost = simulate(mesh, TINY, region, KERNELS[algo], faults=faults, a=a, b=b)
    return A @ B, collect(algo, grid, c, m, n), cost, grid


@pytest.mark.parametrize("algo", GEMM_ALGOS)
@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_each_gemm_equals_numpy_and_books_its_closed_form(mesh, algo):
    want, got, cost, grid = _run(mesh, algo)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert set(cost) == {algo}
    assert cost[algo] == gemm_cost(TINY, algo, grid.shape(10, 12, 7))


@pytest.mark.parametrize("algo", GEMM_ALGOS)
@pytest.mark.parametrize("dead", [dict(cores=[Coord(2, 1)]), dict(cores=[Coord(0, 0), Coord(5, 3)]),
                                  dict(links=[(Coord(1, 2), Coord(2, 2)), (Coord(4, 0), Coord(4, 1))])],
                         ids=["inner core", "two corners", "two links"])
def test_each_gemm_routes_around_dead_cores_and_links(algo, dead):
    mesh = MeshSpec(6, 4, 4, 2)
    faults = FaultMap(frozenset(dead.get("cores", ())), frozenset(frozenset(x) for x in dead.get("links", ())))
    want, got, cost, grid = _run(mesh, algo, faults=faults)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(grid.cols) < 6 and len(grid.rows) < 4
    assert cost[algo].flops == gemm_cost(TINY, algo, grid.shape(10, 12, 7)).flops


def test_place_takes_the_region_or_its_plain_numpy_shape():
    """A region's (h, w) tuple, as callers gave it before Region, is the region: rows first (6 wide, 4 tall)."""
    region, rng = MeshSpec(6, 4, 4, 2).region, np.random.default_rng(0)
    A, B = rng.standard_normal((10, 12)).astype(np.float32), rng.standard_normal((12, 7)).astype(np.float32)
    by_region, by_shape = place("cannon", Grid.of(region), region, A, B), place("cannon", Grid.of(region), (4, 6), A, B)
    assert by_region[0].shape[:2] == (4, 6)
    for got, want in zip(by_shape, by_region, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_grid_with_no_living_row_says_so():
    mesh = MeshSpec(3, 1, 3, 1)
    with pytest.raises(ValueError, match="at least one row and one column"):
        Grid.of(mesh.region, [Coord(1, 0)])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("algo", ["meshgemm", "cannon"])
def test_ring_hops_are_those_of_the_kernels_ring(algo, n):
    order = ring(algo, n)
    assert sorted(order) == list(range(n))
    moves = [abs(order[r] - order[(r + 1) % n]) for r in range(n)] if n > 1 else [0]
    assert ring_hops(algo, n) == (max(moves), sum(moves))
    if algo == "meshgemm":
        assert max(moves) <= 2


def test_meshgemm_moves_at_most_two_hops_where_cannon_wraps_the_line():
    for mesh in (MeshSpec(6, 6, 3, 3), MeshSpec(8, 8, 4, 4)):
        _, _, mg, _ = _run(mesh, "meshgemm", (16, 16, 16))
        _, _, cn, _ = _run(mesh, "cannon", (16, 16, 16))
        steps = mesh.width - 1
        assert mg["meshgemm"].hops == 2 * steps
        assert cn["cannon"].hops == (mesh.width - 1) * steps
        assert mg["meshgemm"].link_bytes == cn["cannon"].link_bytes  # the same traffic, shorter routes


def test_at_wafer_scale_meshgemm_beats_the_long_routes():
    shape = GemmShape(8192, 8192, 8192, 720, 720)
    eff = {a: efficiency(WSE2, a, shape, "float16") for a in GEMM_ALGOS}
    assert eff["meshgemm"] > max(eff["cannon"], eff["summa"])
    assert gemm_cost(WSE2, "meshgemm", shape).flops == 2 * 12 * 12 * 12 * 720


def test_a_gemm_shape_checks_its_counts():
    with pytest.raises(ValueError, match="GemmShape.rows"):
        GemmShape(4, 4, 4, 0, 2)
    with pytest.raises(ValueError, match="unknown GEMM algorithm"):
        GemmShape(4, 4, 4, 2, 2).panels("strassen")
    assert gemm_cost(TINY, "cannon", GemmShape(4, 4, 4, 1, 1)) == Cost(flops=128, cycles=64.0)
