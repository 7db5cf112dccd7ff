"""Closed forms of the three mesh GEMMs (MeshGEMM, Cannon, SUMMA): what C = A @ B costs on a grid of cores.

Contract: a GEMM multiplies A (m, k) by B (k, n) on a grid of ``rows`` x ``cols`` cores, C's (m/rows,
n/cols) blocks one per core (sizes padded up to whole blocks). The shift algorithms (MeshGEMM and Cannon)
cut k in ``gcd(rows, cols)`` panels and run that many steps: every core multiplies its A and B blocks, then
(but after the last step) A's blocks move one place along a ring of each row and B's along a ring of each
column, both at once. Cannon's ring is the line itself, closed by a wrap-around of cols-1 hops; MeshGEMM's
is the *interleaved* ring (positions 0, 2, 4, ..., then the odd ones back down), whose every move is at
most 2 hops. SUMMA cuts k in ``lcm(rows, cols)`` panels; at each step the panel's owner column multicasts
its A block along every row and the owner row its B block along every column, both at once, then every core
multiplies. Every figure is built from waferrt.core.cost's owners (``message_cycles``, ``compute_cost``);
waferrt.kernels.gemm is the emulation, whose booked counts equal these (tests/unit/test_gemm.py).

``efficiency`` is the share of the modelled time the cores spend on the GEMM's useful flops: the flops of
an unpadded m x k x n product spread evenly over the grid, over the modelled cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .arith import cdiv, whole
from .cost import Cost, allreduce_cost, compute_cost, flop_cycles, message_cycles, on_lines, reduce_flops
from .dtypes import check_dtype, itemsize
from .spec import HardwareSpec

GEMM_ALGOS = ("meshgemm", "cannon", "summa")


@dataclass(frozen=True)
class GemmShape:
    """C (m, n) = A (m, k) @ B (k, n) on a grid of rows x cols cores."""

    m: int
    k: int
    n: int
    rows: int
    cols: int

    def __post_init__(self) -> None:
        for name in ("m", "k", "n", "rows", "cols"):
            whole(f"GemmShape.{name}", getattr(self, name))

    def panels(self, algo: str) -> int:
        """How many k panels (= steps) the algorithm runs."""
        check_algo(algo)
        if algo == "summa":
            return math.lcm(self.rows, self.cols)
        return math.gcd(self.rows, self.cols)

    def blocks(self, algo: str) -> tuple[int, int, int]:
        """(mb, kb, nb): a core's A block is (mb, kb), its B block (kb, nb), its C block (mb, nb)."""
        return cdiv(self.m, self.rows), cdiv(self.k, self.panels(algo)), cdiv(self.n, self.cols)


def check_algo(algo: str) -> str:
    if algo not in GEMM_ALGOS:
        raise ValueError(f"unknown GEMM algorithm {algo!r}; choose one of {GEMM_ALGOS}")
    return algo


def ring_hops(algo: str, n: int) -> tuple[int, int]:
    """(longest move, sum of all moves) in hops when every core of a line of n passes its block one place
    along the algorithm's ring: Cannon's line closed by an n-1 hop wrap, MeshGEMM's interleaved ring."""
    if n == 1:
        return 0, 0
    if algo == "cannon":
        return n - 1, 2 * (n - 1)
    if algo == "meshgemm":
        return (1 if n == 2 else 2), 2 * (n - 1)  # n-2 moves of 2 hops and two of 1 (the ends' turns)
    raise ValueError(f"{algo!r} moves no blocks around a ring; the rings are 'cannon' and 'meshgemm'")


def _stage(spec: HardwareSpec, moves) -> Cost:
    """Several moves at once, each (hops, bytes per message, messages, link bytes): one routing stage as
    long as the slowest, the traffic of all."""
    moves = [m for m in moves if m[2]]
    if not moves:
        return Cost()
    slow = max(moves, key=lambda m: message_cycles(spec, m[0], 1, m[1]))
    return Cost(hops=slow[0], stages=1, link_bytes=sum(m[3] for m in moves), messages=sum(m[2] for m in moves),
                cycles=message_cycles(spec, slow[0], 1, slow[1]))


def shift_step_cost(spec: HardwareSpec, algo: str, shape: GemmShape, dtype: str = "float32", batch: int = 1
                    ) -> Cost:
    """One shift of a shift GEMM: A's blocks along every row's ring and B's along every column's, at once
    (`batch` blocks of each per core, moving together)."""
    mb, kb, nb = shape.blocks(algo)
    a_bytes, b_bytes = batch * mb * kb * itemsize(dtype), batch * kb * nb * itemsize(dtype)
    (ax, a_sum), (by, b_sum) = ring_hops(algo, shape.cols), ring_hops(algo, shape.rows)
    a_msgs = shape.rows * shape.cols if shape.cols > 1 else 0
    b_msgs = shape.rows * shape.cols if shape.rows > 1 else 0
    return _stage(spec, [(ax, a_bytes, a_msgs, shape.rows * a_sum * a_bytes),
                         (by, b_bytes, b_msgs, shape.cols * b_sum * b_bytes)])


def summa_step_cost(spec: HardwareSpec, shape: GemmShape, step: int, dtype: str = "float32") -> Cost:
    """SUMMA's step `step`: column step % cols multicasts A along every row, row step % rows B along every
    column (router multicast: one stage as long as the farther end from the root)."""
    mb, kb, nb = shape.blocks("summa")
    a_bytes, b_bytes = mb * kb * itemsize(dtype), kb * nb * itemsize(dtype)
    c, r = step % shape.cols, step % shape.rows
    a_msgs, b_msgs = (shape.cols - 1) * shape.rows, (shape.rows - 1) * shape.cols
    return _stage(spec, [(max(c, shape.cols - 1 - c), a_bytes, a_msgs, a_msgs * a_bytes),
                         (max(r, shape.rows - 1 - r), b_bytes, b_msgs, b_msgs * b_bytes)])


def gemm_cost(spec: HardwareSpec, algo: str, shape: GemmShape, dtype: str = "float32", batch: int = 1,
              rate: str | None = None) -> Cost:
    """The whole GEMM on the critical path: every step's communication then its block product. `batch` GEMMs
    of this shape at once (a shift GEMM's blocks moving together, e.g. one per attention head). The blocks
    move as `dtype`; the cores compute at `rate`'s (a dtype; default `dtype`), as a ``Ledger(spec, rate)``
    books them."""
    check_dtype(dtype)
    mb, kb, nb = shape.blocks(algo)
    steps = shape.panels(algo)
    compute = compute_cost(spec, 2 * batch * mb * kb * nb, rate or dtype).scaled(steps)
    if algo == "summa":
        if batch != 1:
            raise ValueError(f"batch={batch}: only the shift GEMMs (meshgemm, cannon) move a batch of blocks together")
        comm = Cost()
        for s in range(steps):
            comm = comm + summa_step_cost(spec, shape, s, dtype)
        return comm + compute
    return shift_step_cost(spec, algo, shape, dtype, batch).scaled(steps - 1) + compute


def efficiency(spec: HardwareSpec, algo: str, shape: GemmShape, dtype: str = "float32") -> float:
    """Useful compute over modelled time: the unpadded product's flops spread evenly over the grid."""
    ideal = flop_cycles(spec, 2 * shape.m * shape.k * shape.n / (shape.rows * shape.cols), dtype)
    return ideal / gemm_cost(spec, algo, shape, dtype).cycles


def skew_cost(spec: HardwareSpec, side: int, nbytes: int) -> Cost:
    """Every line of a side x side grid rotated by its own ring index along MeshGEMM's rings (blocks of
    `nbytes`): side - 1 rounds, in round r the side - r lines still to move each pass all their blocks."""
    if side == 1:
        return Cost()
    hops, ring_sum = ring_hops("meshgemm", side)
    lines = side * (side - 1) // 2  # over the rounds: side - 1, side - 2, ..., 1 lines
    one = _stage(spec, [(hops, nbytes, 1, 0)]).scaled(side - 1)  # every round as long as one move
    return Cost(one.hops, one.stages, lines * ring_sum * nbytes, lines * side, 0, one.cycles)


@dataclass(frozen=True)
class RingOperand:
    """An operand of MeshGEMM's transposed variant on its interleaved rings: the rings' `length` (places) and the
    `values` (of the GEMM's dtype) of the block each place holds, which moves one place at a move."""

    length: int
    values: int


def _ring_pass(op: RingOperand, rings: int, size: int) -> tuple[int, int, int, int]:
    """Every place of `rings` interleaved rings passing its block of `op` one place on, as a move for ``_stage``:
    (longest hops, bytes a message, messages, link bytes)."""
    hops, ring_sum = ring_hops("meshgemm", op.length)
    return hops, op.values * size, op.length * rings if op.length > 1 else 0, rings * ring_sum * op.values * size


def transposed_cost(spec: HardwareSpec, acc: RingOperand, moving: RingOperand, flops: int, dtype: str = "float32",
                    rate: str | None = None) -> Cost:
    """MeshGEMM's transposed variant (Q.K^T, a GEMM's dX and dW) on MeshGEMM's rings: `acc`, the accumulators,
    and the `moving` operand, each on its rings. s = gcd of the two ring lengths steps of `flops` per core at
    `rate`'s rate (default `dtype`); after each, every accumulator moves one place along its ring, and with
    it, after all but the last step, every block of the moving operand along the other rings. On an
    accumulators' ring longer than s, its places s apart then sum their blocks around it (acc.length / s - 1
    rounds of s one-place moves, an add a value each)."""
    la, lm, size, rate = acc.length, moving.length, itemsize(check_dtype(dtype)), rate or dtype
    s = math.gcd(la, lm)
    acc_moves, moving_moves = _ring_pass(acc, lm, size), _ring_pass(moving, la, size)  # lm rings of la, la of lm
    rounds = la // s - 1
    return (compute_cost(spec, flops, rate).scaled(s) + _stage(spec, [acc_moves, moving_moves]).scaled(s - 1)
            + _stage(spec, [acc_moves]).scaled(1 + rounds * s) + compute_cost(spec, acc.values, rate).scaled(rounds))


@dataclass(frozen=True)
class AttentionShape:
    """Causal attention of `heads` heads over a prompt of `tokens` tokens, head_dim wide, on side x side cores;
    `context` (default `tokens`): the positions its keys and values span (a chunk of a longer prompt attends
    to the context - tokens positions before it too); `kept` (sparse attention's K; 0: every key): the keys a
    query attends to -- a core computes at most min(kept, its block's keys) of a query's products a step."""

    tokens: int
    head_dim: int
    heads: int
    side: int
    context: int = 0
    kept: int = 0

    @property
    def key_block(self) -> int:
        """The keys' positions a block."""
        return cdiv(self.context or self.tokens, self.side)

    @property
    def kept_block(self) -> int:
        """The keys a block whose products a core computes for each query: all, or at most the kept ones."""
        return min(self.key_block, self.kept) if self.kept else self.key_block

    def __post_init__(self) -> None:
        for name in ("tokens", "head_dim", "heads", "side"):
            whole(f"AttentionShape.{name}", getattr(self, name))
        if self.kept < 0:
            raise ValueError(f"AttentionShape.kept is {self.kept}: give the keys a query keeps, or 0 for all")
        if self.context and self.context < self.tokens:
            raise ValueError(f"AttentionShape.context {self.context} is shorter than its {self.tokens} tokens: "
                             "give the positions the keys span, the tokens' own included")


def row_reduce_cost(spec: HardwareSpec, side: int, values: int, dtype: str, rate: str) -> Cost:
    """A K-tree allreduce of `values` `dtype` values per core along every row of side x side cores, and its
    reductions at `rate` (the kernel context books both)."""
    return (on_lines(allreduce_cost(spec, "ktree", side, values * itemsize(dtype)), side)
            + compute_cost(spec, reduce_flops("ktree", side, values), rate))


def probabilities_cost(spec: HardwareSpec, shape: AttentionShape, softmax_flops: int, dtype: str = "float32",
                       rate: str | None = None) -> Cost:
    """The causal softmax(scale Q.K^T) with K already skewed (waferrt.kernels.attention.probabilities): the
    transposed MeshGEMM (side steps; the score blocks move after every step, K's after all but the last),
    the row max and sum (K-tree allreduces along every row), the softmax."""
    side, heads, rate = shape.side, shape.heads, check_dtype(rate or check_dtype(dtype))
    mb, db = cdiv(shape.tokens, side), cdiv(shape.head_dim, side)
    kb, kept = shape.key_block, shape.kept_block
    nt = transposed_cost(spec, RingOperand(side, heads * mb * kept), RingOperand(side, heads * kb * db),
                         2 * heads * mb * db * kept, dtype, rate)  # sparse: compact score blocks, kept a query
    return (nt + row_reduce_cost(spec, side, heads * mb, dtype, rate).scaled(2)
            + compute_cost(spec, softmax_flops * heads * mb * kept, rate))


def attention_cost(spec: HardwareSpec, shape: AttentionShape, softmax_flops: int, dtype: str = "float32",
                   rate: str | None = None) -> Cost:
    """Causal attention over a prompt, every head's blocks moving together (waferrt.kernels.attention): K
    skewed, the probabilities (``probabilities_cost``), V skewed, P.V. Values move as `dtype`; the cores
    compute at `rate`'s (default `dtype`), as ``gemm_cost``."""
    side, heads, size = shape.side, shape.heads, itemsize(check_dtype(dtype))
    mb, kb, kept, db = cdiv(shape.tokens, side), shape.key_block, shape.kept_block, cdiv(shape.head_dim, side)
    pv_step = _stage(spec, [_ring_pass(RingOperand(side, heads * mb * kept), side, size),  # P (compact if sparse)
                            _ring_pass(RingOperand(side, heads * kb * db), side, size)])  # V
    products = compute_cost(spec, 2 * heads * mb * kept * db, rate or dtype).scaled(side)
    return (skew_cost(spec, side, heads * kb * db * size).scaled(2)
            + probabilities_cost(spec, shape, softmax_flops, dtype, rate) + pv_step.scaled(side - 1) + products)
