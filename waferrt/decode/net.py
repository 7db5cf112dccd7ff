"""What a layer's math does across cores: one small interface, its implementations.

Contract: a block of the decode, the prefill and training's forward (waferrt.decode.shards: the RMSNorms, the
QKV projection and RoPE, the attention with its K/V cache, the output projection, the MLP, the head; an MoE
expert's MLP) is written once as numpy math with shape comments; everything it does over its cores goes through a
:class:`Net` -- a projection (``gemv``), a product whose contraction is split over a line of cores and
reduced along it (``dot``), a reduction over a split axis (``reduce``, ``norm2``), STAR's add-only prediction
(``predict``) and sorted-updating FlashAttention over kept keys with its P.V (``flash``), and the element-wise
work (``elementwise``).
:func:`net_of` picks the decode's implementation from the run's ``Collectives``:

- :class:`FastNet` (``coll.fast``): a split axis is held joined, in the order its values have (the K/V
  cache's positions in position order); the result is computed at once and the collective it stands for
  is recorded without moving anything (``LineComm.book_allreduce``: its messages worked out once per line
  and size).
- :class:`HopNet` (the checked mode): a split axis is held as (cores, per core); every core computes its
  share and the partial results travel the line message by message (``LineComm.allreduce``).

and the prefill (waferrt.decode.prefill) runs on the third:

- :class:`SquareNet`: a prompt's chunk of T tokens as one slab (T, 1, width) on the largest square of cores at
  its region's corner (:func:`gemm_region`); a projection (``gemv`` of a weight's :class:`Blocks`) is a
  MeshGEMM kernel over the square (waferrt.kernels.gemm: its messages booked as the kernel sends them; the
  slab first aligned into MeshGEMM's A layout, booked as ``core.gemm_cost.skew_cost``, the closed form the
  kernels' skew is tested to book). Between the kernels the host holds the slab whole: the element-wise work
  is recorded spread over the square's cores, RMSNorm's sum of squares inside its element-wise flops (no
  reduction's messages are modelled).

and inside a kernel over a square of cores (training's forward, waferrt.training.forward; the prompt
attention, waferrt.kernels.attention, which the prefill runs on its square's Context and training inside its
forward and, recomputing P, its backward):

- :class:`KernelNet` (waferrt.decode.kernel_net): every core's block of a slab split over the square's rows
  (tokens) and columns (features); ``norm2`` and ``reduce`` the kernel Context's allreduce along the rows of
  cores, ``elementwise`` every core's block (``ctx.compute``), ``gemv`` a MeshGEMM per part of a ``Parts``
  weight on its input skewed into the A layout (kernels.train_ops.relayout), which it keeps with the output
  (``kept``: what training's backward reads), ``flash`` the online softmax's statistics alone (P.V is the
  attention kernel's MeshGEMM).

The attention's softmax is written once, kernels.attention.softmax, on a Net's ``reduce`` and ``elementwise``:
the decode's dense attention (decode.shards.LayerShard._dense, FastNet / HopNet) and the prompt attention
kernel's (KernelNet) call it; STAR's sparse attention merges every core's ``flash`` with
kernels.sparse_attention.row_statistics on the same two methods (decode.sparse on FastNet / HopNet, the
prefill's sparse attention on KernelNet). SquareNet has no attention of its own: the prompt attention moves
every head's blocks around the square's rings, which a slab the host holds whole cannot stand for, so the
prefill runs it as a kernel on the KernelNet of its square's Context.

Each records what it does into the ledger as it runs: the busiest core's flops (at the ledger's dtype
rate; element-wise work at decode.decoding.ELEMENTWISE_FLOPS per element) and the collective's messages. No
layer code books a flop by hand: a block that does one more GEMV records one more GEMV. On the fast path
a split axis of K/V positions is longer than a core's share (a core holds ``positions`` of them, the
fullest core's count), so calls on such an axis say how many a core holds. The closed forms of
waferrt.decode.cost and decode.prefill price the same work for the estimator; tests/unit/test_fast_path.py
holds FastNet and HopNet to the same records, tests/unit/test_ties.py and test_prefill_layer.py the closed
forms to what they record.

A row's arithmetic on the fast path does not depend on the rows beside it (tests/unit/test_row_independence.py):
BLAS picks its kernel -- and so the order of a sum -- from the shapes of a call (OpenBLAS: one GEMV, small-matrix
kernels, packed GEMM), so a request's logits would depend on how many requests share its micro-batch and how long
their contexts are, and a greedy choice between near ties would flip. So every call here has a shape that the
batch does not set: ``matmul_rows`` multiplies ROW_GROUP rows at a time (the last group padded with zeros), and a
K/V positions axis that is a whole number of POSITION_BLOCKs (the dense attention's view reads whole blocks,
waferrt.decode.kv_layouts) is worked block by block -- every product and sum the same shape, the blocks' results
added in order -- so the masked positions past an item's own context change nothing: a served request's tokens
are those of the same request decoded alone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.gemm_cost import skew_cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.fabric.comm import Collectives, LineComm, Slices, Span
from waferrt.fabric.kernel import Context
from waferrt.kernels.gemm import Grid, collect, meshgemm, place
from waferrt.kernels.sparse_attention import Partial, flash

from .cost import PREDICT_DTYPE
from .decoding import ELEMENTWISE_FLOPS as EW
from .kernel_net import KernelNet

PANEL_ROWS = 64  # the most output rows per BLAS call: a few tokens times a narrow panel of a matrix runs
# 1.5-2x faster than times the whole matrix at once (OpenBLAS packs less; benchmarks/profile_decode.py)
ROW_GROUP = 4  # the rows of x every BLAS call of matmul_rows takes (a lane's usual micro-batch: 8 slots, 2 lanes)
POSITION_BLOCK = 32  # the K/V positions every attention product and sum takes at once (see the module docstring)


@functools.cache
def _panel(rows: int) -> int:
    """The widest panel of at most PANEL_ROWS rows that cuts `rows` evenly."""
    return max(n for n in range(1, min(rows, PANEL_ROWS) + 1) if rows % n == 0)


def matmul_rows(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x (B, in) times w (out, in) transposed -> (B, out), as one batched BLAS call over panels of w's rows, each
    panel times every group of ROW_GROUP rows of x while it is in cache (the last group padded with zeros): every
    call the same shape, so a row's sums do not depend on the other rows (see the module docstring)."""
    B, k = x.shape
    groups = -(-B // ROW_GROUP)
    xg = np.zeros((groups, ROW_GROUP, k), x.dtype)
    xg.reshape(-1, k)[:B] = x
    n = _panel(w.shape[0])
    out = np.matmul(w.reshape(-1, 1, n, k), xg.transpose(0, 2, 1))  # (out/n, groups, n, ROW_GROUP)
    return out.transpose(1, 3, 0, 2).reshape(groups * ROW_GROUP, -1)[:B]


def whole_blocks(length: int) -> int:
    """`length` positions rounded up to whole POSITION_BLOCKs."""
    return -(-length // POSITION_BLOCK) * POSITION_BLOCK


def _in_order(parts: np.ndarray, axis: int) -> np.ndarray:
    """The sum of `parts` along `axis`, one after another from the first (a block of masked positions adds an
    exact zero, wherever the padding ends)."""
    parts = np.moveaxis(parts, axis, 0)
    out = parts[0].copy()
    for part in parts[1:]:
        out += part
    return out


def _blocked_dot(a: np.ndarray, b: np.ndarray, axis: str) -> np.ndarray:
    """a (..., M, K) @ b (..., K, N) with the positions axis -- N on a y-line, K on an x-line -- cut into
    POSITION_BLOCKs: one product per block, the same shape for every block (x-line: the blocks' partial sums
    added in order)."""
    nb = (b.shape[-1] if axis == "y" else a.shape[-1]) // POSITION_BLOCK
    if axis == "y":
        bb = np.moveaxis(b.reshape(*b.shape[:-1], nb, POSITION_BLOCK), -2, -3)  # (..., nb, K, L0)
        out = np.matmul(a[..., None, :, :], bb)  # (..., nb, M, L0)
        return np.moveaxis(out, -3, -2).reshape(*out.shape[:-3], out.shape[-2], -1)
    ab = np.moveaxis(a.reshape(*a.shape[:-1], nb, POSITION_BLOCK), -2, -3)  # (..., nb, M, L0)
    bb = b.reshape(*b.shape[:-2], nb, POSITION_BLOCK, b.shape[-1])  # (..., nb, L0, N)
    return _in_order(np.matmul(ab, bb), -3)


def _blocked(length: int, positions: int) -> bool:
    return bool(positions) and length % POSITION_BLOCK == 0


def _rows(a: np.ndarray, last: int) -> int:
    """How many rows `a` has before its last `last` axes."""
    return math.prod(a.shape[:a.ndim - last])


class FastNet:
    """The fast implementation: results at once, the collectives recorded (see the module docstring)."""

    fast = True

    def __init__(self, coll: Collectives):
        self.coll = coll

    def split(self, a: np.ndarray) -> np.ndarray:
        """a (..., S, k): an axis split over S cores as this implementation holds it -- joined (..., S*k)."""
        return a.reshape(*a.shape[:-2], -1)

    def gemv(self, comm: LineComm, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """MeshGEMV: x (B, P, i) split over the P cores of each of `comm`'s lines; w (Q*o, P*i) every core's
        block (waferrt.decode.pack: line q's outputs, its P cores' inputs side by side). Every core multiplies
        its block, the partial sums are allreduced along the line -> (B, Q, o). Here: one matmul over the
        joined input (the same blocks, each read once)."""
        B, P, i = x.shape
        self._record(comm, B, i, w.shape[0] // comm.lines)
        return matmul_rows(w, x.reshape(B, P * i)).reshape(B, comm.lines, -1)

    def dot(self, comm: LineComm, a: np.ndarray, b: np.ndarray, positions: int = 0) -> np.ndarray:
        """a (..., M, K) times b (..., K, N) -> (..., M, N), K split over `comm`'s line and reduced along it
        (b's N split over the other axis's lines). `positions`: K (on an x-line) or N (on a y-line) is a K/V
        axis of which the fullest core holds that many."""
        ledger = comm.ledger
        if not ledger.quiet:
            k = positions if positions and comm.axis == "x" else a.shape[-1] // comm.n
            n = positions if positions and comm.axis == "y" else b.shape[-1] // comm.lines
            self._record(comm, _rows(a, 1), k, n)
        if _blocked(b.shape[-1] if comm.axis == "y" else a.shape[-1], positions):
            return _blocked_dot(a, b, comm.axis)
        return np.matmul(a, b)

    def _record(self, comm: LineComm, rows: int, k: int, n: int) -> None:
        """A product of `rows` rows by a (k, n) block on every core, then its partial sums' allreduce."""
        ledger = comm.ledger
        if ledger.quiet:  # replaying a layer's records (Ledger.replay)
            return
        ledger.compute(2 * rows * k * n)
        self.allreduced(comm, rows * n * comm.lines)

    def reduce(self, comm: LineComm, a: np.ndarray, op: str, positions: bool = False) -> np.ndarray:
        """The max or sum of a's last axis, split over `comm`'s line, kept as an axis of one (broadcasts back).
        `positions`: that axis is a K/V positions axis (a sum over whole blocks goes block by block)."""
        if op == "max":
            out = a.max(axis=-1, keepdims=True)
        elif _blocked(a.shape[-1], positions):
            blocks = a.reshape(*a.shape[:-1], -1, POSITION_BLOCK).sum(axis=-1)  # (..., nb)
            out = _in_order(blocks, -1)[..., None]
        else:
            out = a.sum(axis=-1, keepdims=True)
        if not comm.ledger.quiet:
            self.allreduced(comm, _rows(a, 1), True)
        return out

    def norm2(self, comm: LineComm, x: np.ndarray) -> np.ndarray:
        """x (B, S, k) -> (B,): the sum of squares of every item's values, split over `comm`'s line."""
        self.allreduced(comm, x.shape[0], True)
        return np.einsum("bcd,bcd->b", x, x)

    def allreduced(self, comm: LineComm, values: int, replicated: bool = False) -> None:
        """Record the allreduce of `values` float32 values per core along `comm`'s lines that a result computed
        another way stands for (sparse attention's partial predictions: waferrt.decode.sparse)."""
        if not comm.ledger.quiet:
            with comm.ledger.op(f"allreduce.{self.coll.algo}"):
                comm.book_allreduce(self.coll.algo, self.coll.k, values, replicated)

    def elementwise(self, comm: LineComm, kind: str, a: np.ndarray, positions: int = 0) -> None:
        """Record element-wise work of `kind` on a, split over `comm`'s line (its last axis a K/V axis of which
        the fullest core holds `positions`)."""
        if not comm.ledger.quiet:
            per_core = a.size // a.shape[-1] * positions if positions else a.size // comm.n
            comm.ledger.compute(EW[kind] * per_core)

    def flash(self, comm: LineComm, s: np.ndarray, kept: np.ndarray, vs: np.ndarray, positions: int = 0) -> Partial:
        """STAR's sorted-updating FlashAttention (kernels.sparse_attention.flash) over each row's kept keys: s
        (..., n) scores, kept (..., n), vs (..., n, D) with D split over `comm`'s lines (as ``dot``'s N) -> the
        Partial. Records every core's P.V over the `positions` kept keys the fullest core holds."""
        part = flash(s, kept, vs)
        self._pv(comm, _rows(s, 1) * (positions or s.shape[-1] // comm.n), vs)
        return part

    def predict(self, comm: LineComm, a: np.ndarray, b: np.ndarray, positions: int = 0) -> np.ndarray:
        """STAR's add-only prediction: a (..., M, K) times log-domain keys b (..., K, N) -> (..., M, N), K split
        over `comm`'s line, N over its lines (`positions`: of which the fullest core holds that many); every
        core's partial products recorded at decode.cost.PREDICT_DTYPE's rate, their reduce left to the caller."""
        if not comm.ledger.quiet:
            n = positions or b.shape[-1] // comm.lines
            with comm.ledger.at_rate(PREDICT_DTYPE):
                comm.ledger.compute(2 * _rows(a, 1) * (a.shape[-1] // comm.n) * n)
        return np.matmul(a, b)

    def _pv(self, comm: LineComm, products: int, vs: np.ndarray) -> None:
        """`products` rows of P times a value of vs's per-core width, on every core."""
        if not comm.ledger.quiet:
            comm.ledger.compute(2 * products * (vs.shape[-1] // comm.lines))


class HopNet(FastNet):
    """The hop-by-hop implementation: every core's share computed, the partial results sent message by message."""

    fast = False

    def split(self, a: np.ndarray) -> np.ndarray:
        """a (..., S, k): kept as (..., S, k)."""
        return a

    def gemv(self, comm: LineComm, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        B, P, i = x.shape
        comm.ledger.compute(2 * B * i * (w.shape[0] // comm.lines))  # every core's (i, o) block, every item
        per_core = w.reshape(-1, P, i).transpose(1, 2, 0)  # (P, i, Q*o): each core's blocks, every line's
        part = np.matmul(x.transpose(1, 0, 2), per_core).reshape(P, B, comm.lines, -1)  # every core's GEMV
        return comm.allreduce(part, self.coll, collapse=True, overwrite=True)

    def dot(self, comm: LineComm, a: np.ndarray, b: np.ndarray, positions: int = 0) -> np.ndarray:
        """a (..., M, S, k) times b (..., S, k, *N) -> (..., M, *N): every core s multiplies its (M, k) by its
        (k, N) share, the partial products are allreduced along the line."""
        k, N = a.shape[-1], b.shape[a.ndim - 1:]
        part = np.matmul(np.moveaxis(a, -2, -3), b.reshape(*b.shape[:a.ndim - 1], -1))  # (..., S, M, N)
        comm.ledger.compute(2 * _rows(a, 2) * k * (part.shape[-1] // comm.lines))
        out = comm.allreduce(part, self.coll, slices=Slices(part.ndim - 3), collapse=True, overwrite=True)
        return out.reshape(*out.shape[:-1], *N)

    def reduce(self, comm: LineComm, a: np.ndarray, op: str, positions: bool = False) -> np.ndarray:
        """a (..., S, n): every core's max or sum of its n, then along the line -> (..., 1, 1)."""
        local = a.max(axis=-1) if op == "max" else a.sum(axis=-1)  # (..., S)
        out = comm.allreduce(local, self.coll, op, Slices(local.ndim - 1, replicated=True), collapse=True)
        return out[..., None, None]

    def norm2(self, comm: LineComm, x: np.ndarray) -> np.ndarray:
        return comm.allreduce((x * x).sum(axis=2), self.coll, slices=Slices(1, replicated=True), collapse=True)

    def elementwise(self, comm: LineComm, kind: str, a: np.ndarray, positions: int = 0) -> None:
        comm.ledger.compute(EW[kind] * (a.size // comm.n))

    def predict(self, comm: LineComm, a: np.ndarray, b: np.ndarray, positions: int = 0) -> np.ndarray:
        """a (..., S, ..., k) times b (..., S, ..., k, N) with N every line's positions side by side: every core's
        partial products (its k, its line's share of N), recorded at PREDICT_DTYPE's rate."""
        with comm.ledger.at_rate(PREDICT_DTYPE):
            comm.ledger.compute(2 * (a.size // a.shape[-1] // comm.n) * a.shape[-1] * (b.shape[-1] // comm.lines))
        return np.matmul(a, b)

    def flash(self, comm: LineComm, s: np.ndarray, kept: np.ndarray, vs: np.ndarray, positions: int = 0) -> Partial:
        """s (..., S, n), kept (..., S, n), vs (..., S, n, D): every core s's own kept keys -> its Partial."""
        part = flash(s, kept, vs)
        self._pv(comm, s.size // s.shape[-2], vs)
        return part


def gemm_region(region: Region) -> Region:
    """The largest square of cores at the region's corner: where the prefill's GEMMs run."""
    side = min(region.w, region.h)
    return Region(region.x0, region.y0, side, side)


@dataclass(frozen=True, eq=False)
class Blocks:
    """A weight as :class:`SquareNet`'s projection takes it: its B blocks where they were carried (rows, cols,
    1, kb, nb: waferrt.kernels.gemm.place's B layout) and its `n` output columns."""

    blocks: np.ndarray
    n: int


class SquareNet:
    """The prefill's implementation: a slab of tokens on a square of cores, projections by MeshGEMM (module doc).
    Its line arguments are the square's (``lines``), kept for the block functions' calls."""

    fast = True

    def __init__(self, region: Region, ledger: Ledger):
        self.region = gemm_region(region)
        self.ctx = Context(Span.of(self.region), ledger, {})
        self.grid, self.ledger, self.side = Grid.of(self.region), ledger, self.region.w

    @property
    def lines(self) -> tuple[LineComm, LineComm]:
        """The square's x- and y-lines."""
        return self.ctx.x, self.ctx.y

    def gemv(self, comm: LineComm, w: Blocks, x: np.ndarray) -> np.ndarray:
        """The slab's projection x (T, 1, k) @ W (k, n) by MeshGEMM -> (T, 1, n)."""
        return self.gemm(x[:, 0], w)[:, None]

    def gemm(self, a: np.ndarray, w: Blocks) -> np.ndarray:
        """a (m, k) @ W (k, n) by MeshGEMM -> (m, n)."""
        return collect("meshgemm", self.grid, self.gemm_blocks(a, w), a.shape[0], w.n)

    def gemm_blocks(self, a: np.ndarray, w: Blocks) -> np.ndarray:
        """As gemm, the product's C blocks (rows, cols, mb, nb) where the kernel leaves them; a aligned into the
        A layout first (its skew booked)."""
        zero = np.broadcast_to(np.float32(0), (a.shape[1], w.n))
        pa, _ = place("meshgemm", self.grid, self.region, a, zero)
        mb, kb = pa.shape[3:]
        self.ledger.add(skew_cost(self.ledger.spec, self.side, mb * kb * pa.itemsize))
        return meshgemm(self.ctx, pa, w.blocks)

    def norm2(self, comm: LineComm, x: np.ndarray) -> np.ndarray:
        """x (T, 1, dim) -> (T,): every token's sum of squares (in RMSNorm's element-wise flops)."""
        return np.einsum("bcd,bcd->b", x, x)

    def elementwise(self, comm: LineComm, kind: str, a: np.ndarray, positions: int = 0) -> None:
        """Record element-wise work of `kind` on the slab a, spread over the square's cores (the busiest's share)."""
        self.ledger.compute(cdiv(EW[kind] * a.size, self.side * self.side))


Net = FastNet | HopNet | SquareNet | KernelNet


def net_of(coll: Collectives) -> Net:
    """The implementation a run's collectives choose: FastNet when ``coll.fast``, else HopNet."""
    return FastNet(coll) if coll.fast else HopNet(coll)
