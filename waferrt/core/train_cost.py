"""Closed forms of training's mesh GEMMs: a GEMM's two backward products, and a training step's three.

Contract: for Y = X W (X (m, k), W (k, n)) on a square grid of side x side cores, the forward is MeshGEMM
(``gemm_cost``), and the backward's two products are MeshGEMM's transposed variant (``transposed_cost``;
waferrt.kernels.gemm_backward runs them and books exactly these, tests/unit/test_gemm_backward.py):

- dX = dY W^T: side steps of a (mb, nb) x (nb, kb) product per core; the (mb, kb) accumulators move along
  the rows after every step, W's (kb, nb) blocks along the columns after all but the last.
- dW = X^T dY: side steps of a (kb, mb) x (mb, nb) product; the (kb, nb) accumulators move along the
  columns (the tokens' sum, reduced over the fabric), X's (mb, kb) blocks along the rows.

So each backward product costs the forward's compute and, per step, one more block move (the
accumulator's) alongside the moving operand's. :func:`train_gemm_costs` is the three of a training step's
GEMM; :func:`step_efficiency` the share of their modelled time spent on useful flops (the unpadded 3 x 2mkn
spread evenly over the grid). Pure: built from waferrt.core.cost's and gemm_cost's owners.
"""

from __future__ import annotations

from .arith import cdiv
from .cost import Cost, flop_cycles
from .dtypes import check_dtype, itemsize
from .gemm_cost import GemmShape, gemm_cost, transposed_cost
from .spec import HardwareSpec

TRAIN_GEMMS = ("forward", "grad_input", "grad_weight")


def _side(shape: GemmShape) -> int:
    if shape.rows != shape.cols:
        raise ValueError(f"the backward GEMMs run on a square grid; got {shape.rows} rows x {shape.cols} cols: "
                         "use kernels.gemm_backward.square(grid) (the largest square of the living cores)")
    return shape.rows


def grad_costs(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32", rate: str | None = None
               ) -> tuple[Cost, Cost]:
    """(dX, dW) of Y = X W on a square grid (module doc): values move as `dtype`, the cores compute at
    `rate`'s (default `dtype`)."""
    side, size = _side(shape), itemsize(check_dtype(dtype))
    rate = check_dtype(rate or dtype)
    mb, kb, nb = cdiv(shape.m, side), cdiv(shape.k, side), cdiv(shape.n, side)
    flops = 2 * mb * kb * nb
    dx = transposed_cost(spec, side, (mb * kb * size, kb * nb * size), flops, rate)
    dw = transposed_cost(spec, side, (kb * nb * size, mb * kb * size), flops, rate)
    return dx, dw


def train_gemm_costs(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32", rate: str | None = None
                     ) -> dict[str, Cost]:
    """A training step's three GEMMs of Y = X W: {"forward", "grad_input", "grad_weight"}."""
    dx, dw = grad_costs(spec, shape, dtype, rate)
    return dict(zip(TRAIN_GEMMS, (gemm_cost(spec, "meshgemm", shape, dtype, 1, rate), dx, dw)))


def step_efficiency(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32") -> float:
    """Useful compute over modelled time of the three GEMMs: 3 x 2mkn flops spread evenly over the grid."""
    ideal = flop_cycles(spec, 3 * 2 * shape.m * shape.k * shape.n / (shape.rows * shape.cols), dtype)
    return ideal / sum(c.cycles for c in train_gemm_costs(spec, shape, dtype).values())
