"""Three mesh GEMMs as kernels of the programming model: MeshGEMM, Cannon and SUMMA, C = A @ B.

Contract: ``meshgemm(ctx, a, b)``, ``cannon(ctx, a, b)`` and ``summa(ctx, a, b)`` are kernels (run them
with ``wafer.run`` through :func:`gemm_kernel`, or ``waferrt.fabric.loop.simulate``): `a` and `b` are this
tile's cores' blocks in the algorithm's input layout, which :func:`place` makes from whole matrices on the
host; each returns the cores' C blocks, which :func:`collect` puts together. Every block moves only
through the fabric, hop by hop (``ctx.x`` / ``ctx.y``: the region's lines, whose transfers and multicasts
forward through every tile in between), booked under the algorithm's name; what the booking must come to
is waferrt.core.gemm_cost (the algorithms are described there).

Dead cores and links are routed around: :class:`Grid` leaves out every row and every column of the region
that holds a dead core (and every row or column with a dead link along it), so that every core on a row or
column that is used is alive; the GEMM runs on the grid of the rows and columns left, its blocks passing
through the unused (living) cores in between. The cores left out hold zeros; the shift GEMMs book only the
lines they use, SUMMA's multicasts whole lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from waferrt.core.gemm_cost import GemmShape, check_algo
from waferrt.core.mesh import Region

from .sparse_attention import KeptKeys


@dataclass(frozen=True)
class Grid:
    """The region positions (from its corner) of the columns and rows of cores a GEMM uses."""

    cols: tuple[int, ...]
    rows: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.cols or not self.rows:
            raise ValueError(f"a GEMM needs at least one row and one column of living cores, got columns "
                             f"{self.cols} and rows {self.rows}: pick a region with fewer dead cores")

    @classmethod
    def of(cls, region: Region, dead_cores=(), dead_links=()) -> Grid:
        """The rows and columns of `region` with no dead core and no dead link along them."""
        bad_x = {c.x for c in dead_cores} | {a.x for a, b in dead_links if a.x == b.x}
        bad_y = {c.y for c in dead_cores} | {a.y for a, b in dead_links if a.y == b.y}
        return cls(tuple(x - region.x0 for x in range(region.x0, region.x1) if x not in bad_x),
                   tuple(y - region.y0 for y in range(region.y0, region.y1) if y not in bad_y))

    @classmethod
    def of_ctx(cls, ctx) -> Grid:
        return cls.of(ctx.region, ctx.dead_cores, [tuple(sorted(link)) for link in ctx.dead_links])

    def shape(self, m: int, k: int, n: int) -> GemmShape:
        return GemmShape(m, k, n, len(self.rows), len(self.cols))


def ring(algo: str, n: int) -> list[int]:
    """The order in which a line's n places pass blocks on: Cannon's is the line itself (the last place
    back to the first is the wrap-around), MeshGEMM's interleaves it, 0, 2, 4, ..., then the odd places back
    down, so that ring neighbours are at most two places apart."""
    if algo == "cannon":
        return list(range(n))
    return list(range(0, n, 2)) + list(range(n - 1 - n % 2, 0, -2))


# -- the host's side: whole matrices to blocks and back ------------------------------------------------
def cut_blocks(mat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """`mat` (m, n) zero-padded and cut in rows x cols equal blocks: (rows, cols, ceil(m / rows), ceil(n / cols))."""
    block_rows, block_cols = math.ceil(mat.shape[0] / rows), math.ceil(mat.shape[1] / cols)
    padded = np.zeros((rows * block_rows, cols * block_cols), mat.dtype)
    padded[:mat.shape[0], :mat.shape[1]] = mat
    return padded.reshape(rows, block_rows, cols, block_cols).swapaxes(1, 2)


def places(algo: str, grid: Grid) -> tuple[list[int], list[int]]:
    """(x, y) region positions of logical column j / row i: for the shift GEMMs, ring place j / i."""
    if algo == "summa":
        return list(grid.cols), list(grid.rows)
    return ([grid.cols[j] for j in ring(algo, len(grid.cols))], [grid.rows[i] for i in ring(algo, len(grid.rows))])


def place(algo: str, grid: Grid, region: Region | tuple[int, int], A: np.ndarray, B: np.ndarray):
    """The kernels' inputs for the whole `region` (h, w, panels, block...): core (i, j) of the grid (the
    ring's places for the shift GEMMs) gets A(i, (i + j) % s) and B((i + j) % s, j) (Cannon's alignment),
    or SUMMA's panels k = j, j + cols, ... of A and k = i, i + rows, ... of B. Unused cores get zeros.
    `region` may be given as its ``region.shape``, a plain (h, w) tuple, as earlier versions took it."""
    region = region if isinstance(region, Region) else Region(0, 0, region[1], region[0])
    shape = grid.shape(A.shape[0], A.shape[1], B.shape[1])
    mb, kb, nb = shape.blocks(check_algo(algo))
    s, p, q = shape.panels(algo), shape.rows, shape.cols
    ab, bb = cut_blocks(A, p, s), cut_blocks(B, s, q)
    span = (s // q, s // p) if algo == "summa" else (1, 1)
    a = np.zeros((*region.shape, span[0], mb, kb), A.dtype)
    b = np.zeros((*region.shape, span[1], kb, nb), B.dtype)
    xs, ys = places(algo, grid)
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            if algo == "summa":
                a[y, x] = ab[i, j::q]
                b[y, x] = bb[i::p, j]
            else:
                a[y, x, 0], b[y, x, 0] = ab[i, (i + j) % s], bb[(i + j) % s, j]
    return a, b


def spread(grid: Grid, region: Region, M: np.ndarray) -> np.ndarray:
    """M (m, n) in the C layout a MeshGEMM leaves: block (i, c) on MeshGEMM's ring place (i, c), for the whole
    `region` (h, w, m / rows, n / cols); unused cores get zeros. :func:`collect` ("meshgemm") reads it back."""
    blocks = cut_blocks(M, len(grid.rows), len(grid.cols))
    out = np.zeros(region.shape + blocks.shape[2:], M.dtype)
    xs, ys = places("meshgemm", grid)
    for i, y in enumerate(ys):
        for c, x in enumerate(xs):
            out[y, x] = blocks[i, c]
    return out


def collect(algo: str, grid: Grid, c: np.ndarray, m: int, n: int) -> np.ndarray:
    """C (m, n) from the kernels' output for the whole region (h, w, mb, nb)."""
    xs, ys = places(check_algo(algo), grid)
    blocks = np.stack([np.stack([c[y, x] for x in xs]) for y in ys])
    return blocks.swapaxes(1, 2).reshape(len(ys) * c.shape[2], -1)[:m, :n]


# -- the kernels --------------------------------------------------------------------------------------
def _put(out: np.ndarray, pos: np.ndarray, val: np.ndarray, axis: int) -> None:
    idx = [slice(None)] * out.ndim
    idx[axis] = pos
    out[tuple(idx)] = val


def used_lines(ctx, lines, axis: str) -> int:
    """How many of `lines` (region positions of lines along `axis`: rows for "x", columns for "y") lie in
    this tile."""
    if axis == "x":
        lo, m = ctx.local.y0 - ctx.region.y0, ctx.local.h
    else:
        lo, m = ctx.local.x0 - ctx.region.x0, ctx.local.w
    return sum(lo <= u < lo + m for u in lines)


def ring_move(ctx, buf: np.ndarray, axis: str, places: list[int], lines: int) -> np.ndarray:
    """Every place of the ring `places` (region positions along `axis`) receives the block of the next
    place: one transfer per distance, all at once (call inside ``ledger.concurrent``). A ring of one place
    keeps its block."""
    if len(places) == 1:
        return buf
    comm, ax = (ctx.x, 1) if axis == "x" else (ctx.y, 0)
    lo, m = comm.lo, comm.m
    out = np.zeros_like(buf)
    moves: dict[int, list[int]] = {}
    for r, dst in enumerate(places):
        src = places[(r + 1) % len(places)]
        moves.setdefault(dst - src, []).append(src)
    for dist, srcs in sorted(moves.items()):
        if dist == 0:
            continue
        senders = sum(lo <= s < lo + m for s in srcs) * lines
        pos, val = comm.transfer(buf, srcs, dist, ax, senders=senders)
        _put(out, pos, val, ax)
    return out


def _shift_gemm(ctx, a: np.ndarray, b: np.ndarray, algo: str, kept: KeptKeys | None = None) -> np.ndarray:
    """Cannon's algorithm on the rings `algo` names: gcd(rows, cols) block products, a ring shift between.
    a (rows, cols, 1, *batch, mb, kb), b (rows, cols, 1, *batch, kb, nb): every core multiplies a batch of
    blocks (e.g. one per attention head) at once, and moves them together. `kept` (sparse attention's P.V on
    a square, waferrt.kernels.sparse_attention.KeptKeys): a's blocks are compact, (.., mb, kept) probabilities
    of each query's kept keys; a step multiplies them by their keys' rows of b's block (``kept.weighted``), and
    books and moves only those."""
    grid = Grid.of_ctx(ctx)
    xs, ys = places(algo, grid)
    steps = math.gcd(len(xs), len(ys))
    a, b = a[:, :, 0], b[:, :, 0]  # (rows, cols, *batch, mb, kb), (rows, cols, *batch, kb, nb)
    lines_x, lines_y = used_lines(ctx, grid.rows, "x"), used_lines(ctx, grid.cols, "y")
    c = np.zeros(a.shape[:-1] + b.shape[-1:], np.result_type(a, b))
    with ctx.ledger.op(algo):
        for t in range(steps):
            if t:
                with ctx.ledger.concurrent():
                    a = ring_move(ctx, a, "x", xs, lines_x)
                    b = ring_move(ctx, b, "y", ys, lines_y)
            c += kept.weighted(t, a, b) if kept is not None else a @ b
            ctx.ledger.compute(2 * math.prod(a.shape[2:]) * b.shape[-1])
    return c


def meshgemm(ctx, a: np.ndarray, b: np.ndarray, kept: KeptKeys | None = None) -> np.ndarray:
    """MeshGEMM: Cannon's steps on the interleaved rings, every move at most two hops (`kept`: _shift_gemm's)."""
    return _shift_gemm(ctx, a, b, "meshgemm", kept)


def cannon(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cannon: the blocks shift along each line, the last core's back to the first (line-1 hops)."""
    return _shift_gemm(ctx, a, b, "cannon")


def summa(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SUMMA: at step k the owner column multicasts its A panel along the rows, the owner row its B panel
    down the columns, and every core adds the product."""
    grid = Grid.of_ctx(ctx)
    p, q = len(grid.rows), len(grid.cols)
    c = np.zeros(a.shape[:2] + (a.shape[3], b.shape[4]), np.result_type(a, b))
    with ctx.ledger.op("summa"):
        for k in range(math.lcm(p, q)):
            with ctx.ledger.concurrent():
                ak = ctx.x.broadcast(a[:, :, k // q], grid.cols[k % q], 1)
                bk = ctx.y.broadcast(b[:, :, k // p], grid.rows[k % p], 0)
            c += ak @ bk
            ctx.ledger.compute(2 * a.shape[3] * a.shape[4] * b.shape[4])
    return c


KERNELS = {"meshgemm": meshgemm, "cannon": cannon, "summa": summa}


def gemm_kernel(ctx, algo: str, a: str, b: str, c: str) -> None:
    """The DSM form for ``wafer.run``: C's blocks into tensor `c` from those of tensors `a` and `b`, each the
    whole region's array of :func:`place` (:func:`collect`'s for `c`) split ("y", "x", None, ...): e.g.
    ``wafer.run(gemm_kernel, algo="meshgemm", a="A", b="B", c="C")``."""
    live = ctx.live
    got = KERNELS[check_algo(algo)](ctx, ctx.load(a, where=live)[:, :, 0, 0], ctx.load(b, where=live)[:, :, 0, 0])
    ctx.store(c, got[:, :, None, None], where=live)
