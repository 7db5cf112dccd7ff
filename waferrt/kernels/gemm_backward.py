"""The two backward products of a MeshGEMM, as kernels laid out as the forward's: for Y = X W, dX = dY W^T
and dW = X^T dY.

Contract: the forward ``meshgemm`` leaves X (m, k) in the *A layout* (core at ring place (i, j) holds block
X(i, (i + j) % s)), W (k, n) in the *B layout* (W((i + j) % s, j)) and Y (m, n) in the *C layout* (Y(i, j)),
on a square grid of s x s living cores (:func:`square`). The backward keeps every operand where the forward
had it and sends no transposed block across the mesh: each is MeshGEMM's *transposed* variant, the one
``waferrt.kernels.attention`` runs for Q.K^T -- one operand stays put, the other moves one place along its
rings after every step, and a partial-sum block (the accumulator) moves one place along the other rings, so
that after s steps every accumulator has met every block it needs; a core transposes only its own block.

- ``grad_input`` (NT, dX = dY W^T): dY stays in the C layout, W's blocks move along the columns' rings (as
  they do in the forward), dX's accumulators along the rows'. dX lands in the A layout: where X was.
- ``grad_weight`` (TN, dW = X^T dY): dY stays, X's blocks move along the rows' rings (as in the forward),
  dW's accumulators along the columns': the tokens (the batch/sequence dimension, split over the grid's
  rows) are summed as the accumulators pass down the columns -- the weight gradient reduced over the fabric,
  hop by hop, with no separate allreduce. dW lands in the B layout: where W is.

Both take blocks with leading batch axes (rows, cols, *batch, ...) that move together (one per attention
head). Every move is ``ring_move`` (booked hop by hop); what each books is
``waferrt.core.train_cost.grad_costs`` (tests/unit/test_gemm_backward.py ties them). :func:`square` is the
grid the backward uses: the largest square of the living rows and columns (a 1 x N mesh runs on one core;
dead cores are routed around as ``Grid`` does). :func:`gather` reads a layout's blocks back into a matrix.
"""

from __future__ import annotations

import math

import numpy as np

from .gemm import Grid, _blocks, places, ring_move, used_lines

LAYOUTS = ("A", "B", "C")


def square(grid: Grid) -> Grid:
    """The largest square of `grid`'s rows and columns (its first ones)."""
    s = min(len(grid.rows), len(grid.cols))
    return Grid(grid.cols[:s], grid.rows[:s])


def accumulate(ctx, grid: Grid, fixed: np.ndarray, moving: np.ndarray, variant: str) -> np.ndarray:
    """The transposed MeshGEMM on a square `grid` (module doc). variant "nt": acc += fixed @ moving^T, the
    accumulators along the rows ("x"), `moving` along the columns; "tn": acc += moving^T @ fixed, the
    accumulators along the columns, `moving` along the rows. s steps; the accumulators move after each,
    `moving` after all but the last."""
    xs, ys = places("meshgemm", grid)
    s = len(xs)
    if variant == "nt":
        along, other, contract = ("x", xs, used_lines(ctx, ys, "x")), ("y", ys, used_lines(ctx, xs, "y")), -1
        product = lambda f, m: f @ m.swapaxes(-1, -2)  # noqa: E731
    elif variant == "tn":
        along, other, contract = ("y", ys, used_lines(ctx, xs, "y")), ("x", xs, used_lines(ctx, ys, "x")), -2
        product = lambda f, m: m.swapaxes(-1, -2) @ f  # noqa: E731
    else:
        raise ValueError(f"the transposed MeshGEMM is 'nt' (A B^T) or 'tn' (A^T B), got {variant!r}")
    acc = np.float32(0)
    for t in range(s):
        acc = acc + product(fixed, moving)
        ctx.ledger.compute(2 * math.prod(acc.shape[2:]) * fixed.shape[contract])
        with ctx.ledger.concurrent():
            acc = ring_move(ctx, acc, *along)
            if t < s - 1:
                moving = ring_move(ctx, moving, *other)
    return acc


def grad_input(ctx, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dX = dY W^T: dy (rows, cols, *batch, mb, nb) in the C layout, w (rows, cols, *batch, kb, nb) in the B
    layout -> dX's (mb, kb) blocks in the A layout. Booked under "grad_input"."""
    with ctx.ledger.op("grad_input"):
        return accumulate(ctx, square(Grid.of_ctx(ctx)), dy, w, "nt")


def grad_weight(ctx, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW = X^T dY: x (rows, cols, *batch, mb, kb) in the A layout, dy (rows, cols, *batch, mb, nb) in the C
    layout -> dW's (kb, nb) blocks in the B layout. Booked under "grad_weight"."""
    with ctx.ledger.op("grad_weight"):
        return accumulate(ctx, square(Grid.of_ctx(ctx)), dy, x, "tn")


# -- the host's side: a matrix into a layout's blocks and back -----------------------------------------
def _where(layout: str, s: int, i: int, j: int) -> tuple[int, int]:
    """The block (block row, block col) that ring place (i, j) holds in `layout`."""
    return {"A": (i, (i + j) % s), "B": ((i + j) % s, j), "C": (i, j)}[layout]


def scatter(layout: str, grid: Grid, region_shape: tuple[int, int], mat: np.ndarray) -> np.ndarray:
    """mat (r, c) cut in s x s blocks (zero-padded), each on the core `layout` puts it: the whole region's
    (h, w, r/s, c/s); the cores off the square get zeros."""
    s = len(grid.rows)
    blocks = _blocks(mat, (math.ceil(mat.shape[0] / s), math.ceil(mat.shape[1] / s)), (s, s))
    out = np.zeros(region_shape + blocks.shape[2:], mat.dtype)
    xs, ys = places("meshgemm", grid)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            out[y, x] = blocks[_where(layout, s, i, j)]
    return out


def gather(layout: str, grid: Grid, blocks: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The matrix of `shape` whose blocks (h, w, rb, cb) lie in `layout` on the square `grid`."""
    s = len(grid.rows)
    xs, ys = places("meshgemm", grid)
    out = np.zeros((s, s) + blocks.shape[2:], blocks.dtype)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            out[_where(layout, s, i, j)] = blocks[y, x]
    return out.swapaxes(1, 2).reshape(s * blocks.shape[2], s * blocks.shape[3])[:shape[0], :shape[1]]
