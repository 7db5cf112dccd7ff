"""The three mesh GEMMs through the real path -- Ray tile actors, pyzmq links, the DSM -- on a 6x4 mesh of
3x2-core tiles: C equals numpy, and what the tiles book equals the closed form (waferrt.core.gemm_cost)."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.gemm_cost import GEMM_ALGOS, gemm_cost
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.kernels.gemm import Grid, collect, gemm_kernel, place
from waferrt.runtime import Wafer


@pytest.fixture(scope="module")
def wafer(ray_session):
    with Wafer(spec=TINY, mesh=MeshSpec(6, 4, 3, 2)) as w:
        yield w


@pytest.mark.parametrize("algo", GEMM_ALGOS)
def test_gemm_on_tile_actors_equals_numpy_and_its_closed_form(wafer, algo):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((9, 14)).astype(np.float32)
    B = rng.standard_normal((14, 11)).astype(np.float32)
    region = wafer.mesh.region
    grid = Grid.of(region)
    a, b = place(algo, grid, region.shape, A, B)
    for name, blocks in (("A", a), ("B", b)):
        wafer.dsm.alloc(f"{name}.{algo}", blocks.shape, split=("y", "x", None, None, None))
        wafer.dsm.put(f"{name}.{algo}", blocks)
    c_shape = region.shape + (a.shape[3], b.shape[4])
    wafer.dsm.alloc(f"C.{algo}", c_shape, split=("y", "x", None, None))
    cost = wafer.run(gemm_kernel, algo=algo, a=f"A.{algo}", b=f"B.{algo}", c=f"C.{algo}")
    np.testing.assert_allclose(collect(algo, grid, wafer.dsm.get(f"C.{algo}"), 9, 11), A @ B, rtol=1e-4, atol=1e-4)
    assert cost[algo] == gemm_cost(TINY, algo, grid.shape(9, 14, 11))
