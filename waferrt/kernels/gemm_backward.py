"""The two backward products of a MeshGEMM, as kernels laid out as the forward's: for Y = X W, dX = dY W^T
and dW = X^T dY.

Contract: the forward ``meshgemm`` leaves X (m, k) in the *A layout* (core at ring place (i, j) holds block
X(i, (i + j) % s)), W (k, n) in the *B layout* (W((i + j) % s, j)) and Y (m, n) in the *C layout* (Y(i, j)),
on a grid of living cores (``Grid``; s = gcd(rows, cols), the k panels). The backward keeps every operand
where the forward had it and sends no transposed block across the mesh: each is MeshGEMM's *transposed* variant, the one
``waferrt.kernels.attention`` runs for Q.K^T -- one operand stays put, the other moves one place along its
rings after every step, and a partial-sum block (the accumulator) moves one place along the other rings, so
that after s steps every accumulator has met the blocks of s lines; a core transposes only its own block.

- ``grad_input`` (NT, dX = dY W^T): dY stays in the C layout, W's blocks move along the columns' rings (as
  they do in the forward), dX's accumulators along the rows'. dX lands in the A layout: where X was.
- ``grad_weight`` (TN, dW = X^T dY): dY stays, X's blocks move along the rows' rings (as in the forward),
  dW's accumulators along the columns': the tokens (the batch/sequence dimension, split over the grid's
  rows) are summed as the accumulators pass down the columns -- the weight gradient reduced over the fabric,
  hop by hop, with no separate allreduce. dW lands in the B layout: where W is.

On a grid of rows x cols cores the steps are s = gcd(rows, cols), as the forward's: an A or B block is then
held by cols / s (rows / s) cores, whose partial sums the rings add up at the end (``ring_sum``: on a 1 x N
row, the N cores' partial dX summed around the row). Dead cores are routed around as ``Grid`` does (their
rows and columns left out). Both take blocks with leading batch axes (rows, cols, *batch, ...) that move
together (one per attention head). Every move is ``ring_move`` (booked hop by hop); what each books is
``waferrt.core.train_cost.grad_costs`` (tests/unit/test_gemm_backward.py ties them). :func:`scatter` puts a
matrix in a layout's blocks, :func:`gather` reads them back.
"""

from __future__ import annotations

import math

import numpy as np

from waferrt.core.mesh import Region

from .gemm import Grid, cut_blocks, places, ring_move, used_lines
from .sparse_attention import KeptKeys

LAYOUTS = ("A", "B", "C")


def accumulate(ctx, grid: Grid, fixed: np.ndarray, moving: np.ndarray, variant: str, kept: KeptKeys | None = None
               ) -> np.ndarray:
    """The transposed MeshGEMM on `grid`'s rows x cols cores (module doc). variant "nt": acc += fixed @
    moving^T, the accumulators along the rows' rings ("x"), `moving` along the columns'; "tn": acc += moving^T
    @ fixed, the accumulators along the columns', `moving` along the rows'. s = gcd(rows, cols) steps; the
    accumulators move after each, `moving` after all but the last. On a ring longer than s, the ring's
    places s apart then hold partial sums of the same block: they are summed around the ring
    (:func:`ring_sum`). `kept` (variant "nt" on a square only; sparse attention's
    waferrt.kernels.sparse_attention.KeptKeys): the accumulators are compact, a query's kept keys of their key
    block alone; a step computes and books `product(t, fixed, moving)`, and only those entries move."""
    xs, ys = places("meshgemm", grid)
    s = math.gcd(len(xs), len(ys))
    if variant == "nt":
        along, other, contract = ("x", xs, used_lines(ctx, ys, "x")), ("y", ys, used_lines(ctx, xs, "y")), -1
        product = lambda f, m: f @ m.swapaxes(-1, -2)  # noqa: E731
    elif variant == "tn":
        along, other, contract = ("y", ys, used_lines(ctx, xs, "y")), ("x", xs, used_lines(ctx, ys, "x")), -2
        product = lambda f, m: m.swapaxes(-1, -2) @ f  # noqa: E731
    else:
        raise ValueError(f"the transposed MeshGEMM is 'nt' (A B^T) or 'tn' (A^T B), got {variant!r}")
    if kept is not None and (variant != "nt" or len(xs) != len(ys)):
        raise ValueError("only the square's 'nt' transposed MeshGEMM (Q.K^T) computes kept entries alone; run "
                         f"variant {variant!r} on {len(ys)}x{len(xs)} places without `kept`")
    acc = np.float32(0)
    for t in range(s):
        acc = acc + (kept.product(t, fixed, moving) if kept is not None else product(fixed, moving))
        ctx.ledger.compute(2 * math.prod(acc.shape[2:]) * fixed.shape[contract])
        with ctx.ledger.concurrent():
            acc = ring_move(ctx, acc, *along)
            if t < s - 1:
                moving = ring_move(ctx, moving, *other)
    return ring_sum(ctx, acc, along, s)


def ring_sum(ctx, acc: np.ndarray, along: tuple, stride: int) -> np.ndarray:
    """Every place of the rings `along` (axis, places, lines) ends with the sum of the blocks of the places
    `stride` apart from it: the blocks pass `stride` places on (one place a move), n / stride - 1 times."""
    total, passing = acc, acc
    for _ in range(len(along[1]) // stride - 1):
        for _ in range(stride):
            with ctx.ledger.concurrent():
                passing = ring_move(ctx, passing, *along)
        total = total + passing
        ctx.ledger.compute(math.prod(acc.shape[2:]))
    return total


def grad_input(ctx, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dX = dY W^T: dy (rows, cols, *batch, mb, nb) in the C layout, w (rows, cols, *batch, kb, nb) in the B
    layout -> dX's (mb, kb) blocks in the A layout. Booked under "grad_input"."""
    with ctx.ledger.op("grad_input"):
        return accumulate(ctx, Grid.of_ctx(ctx), dy, w, "nt")


def grad_weight(ctx, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dW = X^T dY: x (rows, cols, *batch, mb, kb) in the A layout, dy (rows, cols, *batch, mb, nb) in the C
    layout -> dW's (kb, nb) blocks in the B layout. Booked under "grad_weight"."""
    with ctx.ledger.op("grad_weight"):
        return accumulate(ctx, Grid.of_ctx(ctx), dy, x, "tn")


# -- the host's side: a matrix into a layout's blocks and back -----------------------------------------
def _counts(layout: str, grid: Grid) -> tuple[int, int]:
    """How many blocks a layout cuts a matrix in: A (rows, s), B (s, cols), C (rows, cols); s = gcd."""
    p, q = len(grid.rows), len(grid.cols)
    s = math.gcd(p, q)
    return {"A": (p, s), "B": (s, q), "C": (p, q)}[layout]


def _where(layout: str, s: int, i: int, j: int) -> tuple[int, int]:
    """The block (block row, block col) that ring place (i, j) holds in `layout` (s = gcd(rows, cols))."""
    return {"A": (i, (i + j) % s), "B": ((i + j) % s, j), "C": (i, j)}[layout]


def scatter(layout: str, grid: Grid, region: Region, mat: np.ndarray) -> np.ndarray:
    """mat (r, c) cut in `layout`'s blocks (zero-padded), each on the cores `layout` puts it: the whole
    `region`'s (h, w, block rows, block cols); the cores off the grid get zeros."""
    blocks = cut_blocks(mat, *_counts(layout, grid))
    out = np.zeros(region.shape + blocks.shape[2:], mat.dtype)
    xs, ys = places("meshgemm", grid)
    s = math.gcd(len(xs), len(ys))
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            out[y, x] = blocks[_where(layout, s, i, j)]
    return out


def gather(layout: str, grid: Grid, blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The rows x cols matrix whose blocks (h, w, rb, cb) lie in `layout` on `grid` (a block several cores
    hold is read from one of them)."""
    count = _counts(layout, grid)
    xs, ys = places("meshgemm", grid)
    s = math.gcd(len(xs), len(ys))
    out = np.zeros(count + blocks.shape[2:], blocks.dtype)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            out[_where(layout, s, i, j)] = blocks[y, x]
    return out.swapaxes(1, 2).reshape(count[0] * blocks.shape[2], count[1] * blocks.shape[3])[:rows, :cols]
