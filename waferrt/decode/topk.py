"""STAR's distributed top-K along a row of cores: each core selects its own best, then a streamed merge
across neighbours (issue 22).

Contract: a row of n cores holds a request's positions, m per core (core j holds positions j*m .. j*m+m-1),
and for each of H query heads every core has its positions' predicted scores (``scores`` block (H, m)).
`row_topk(ctx, scores, keep)` leaves on every core of the row the `keep` highest-scoring positions of the
whole row per head, highest first, ties to the earlier position: exactly
``waferrt.model.sparse.select_top`` over the row's concatenated scores. How:

1. local selection: each core keeps its best k = min(m, K) in a binary heap of k entries (each candidate
   sifts through at most the heap's depth), padded to K (``-inf`` at a position past every real one),
   booked as ``topk.select``: H * `select_comparisons`(m, K);
2. streamed merge: two chains run towards the middle core c = (n-1)//2, one from each end; each round every
   chain's front core sends its K best (scores and positions: 8 bytes an entry) ONE hop to its neighbour,
   which merges them with its own. The lists are sorted, so a core merges and forwards entry by entry as
   they come (a pipelined chain, as the K-tree allreduce streams its partial sums): a round pays a hop and
   a routing stage, and the K entries are serialised and merged (K comparisons per head) once per chain
   the middle reads (two when both chains reach it) -- the merges along the chain overlap in the pipe --
   instead of once a round: the merge no longer grows with n times the message. The two chains'
   messages travel at once (one routing stage). ceil((n-1)/2) rounds, booked as ``topk.merge``;
3. the middle core multicasts the K winners along the row (router multicast), ``broadcast``.

The fast path (``Collectives(fast=True)``) picks the lists with numpy and records the same schedule step by
step (`record_topk`, the merge's rounds from `merge_rounds`, which the kernel runs too).

`topk_cost(spec, row)` is the closed form of the three, from ``core.cost``'s owners only (``compute_cost``,
``message_cycles``, ``serialise_cycles`` and ``broadcast_cost``), for the estimator; it equals what the kernel
and `record_topk` record (tested). A layer's sparse attention (prediction, this top-K, attention over the
chosen keys) is costed by ``decode.cost.layer_decode_parts`` under a sparse ``Decoding.attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from waferrt.core.cost import Cost, broadcast_cost, compute_cost, message_cycles, serialise_cycles
from waferrt.core.spec import HardwareSpec
from waferrt.fabric.comm import LineComm

ENTRY_BYTES = 8  # a float32 score and an int32 position
PAD_POSITION = np.iinfo(np.int32).max  # a padding entry: after every real position on ties


@dataclass(frozen=True)
class TopKRow:
    """A row of `cores` cores, `per_core` candidate positions each, `heads` query heads, `keep` kept."""

    cores: int
    per_core: int
    heads: int
    keep: int

    def __post_init__(self) -> None:
        for name in ("cores", "per_core", "heads", "keep"):
            if getattr(self, name) < 1:
                raise ValueError(f"TopKRow.{name} is {getattr(self, name)}; it counts something and must be >= 1")
        if self.keep > self.cores * self.per_core:
            raise ValueError(f"keeping {self.keep} of the {self.cores * self.per_core} positions a row of "
                             f"{self.cores} cores x {self.per_core} holds: keep at most that many (or dense)")

    @property
    def middle(self) -> int:
        return (self.cores - 1) // 2

    @property
    def rounds(self) -> int:
        return self.cores - 1 - self.middle

    @property
    def message_bytes(self) -> int:
        return ENTRY_BYTES * self.heads * self.keep


    @property
    def streams(self) -> int:
        """Chains the middle core reads (each serialises the K entries once): 2 when both reach it."""
        return min(2, self.cores - 1)


@dataclass(frozen=True)
class Round:
    """Round `number` (1-based) of the streamed merge: which chains still move -- the east one, from core 0
    towards the middle, and the west one, from the last core."""

    number: int
    east: bool
    west: bool

    def sends(self, row: TopKRow) -> list[Send]:
        """Every moving chain's front this round, sending one hop towards the middle."""
        return [*([Send(self.number - 1, 1)] if self.east else []),
                *([Send(row.cores - self.number, -1)] if self.west else [])]


@dataclass(frozen=True)
class Send:
    """A chain's front `sender` (its place in the row) sending its list one hop: dx = +1 East, -1 West."""

    sender: int
    dx: int


def merge_rounds(row: TopKRow) -> list[Round]:
    """The merge's schedule, which both the kernel (`row_topk`) and the fast path (`record_topk`) run."""
    return [Round(r, r <= row.middle, r <= row.rounds) for r in range(1, row.rounds + 1)]


def select_comparisons(m: int, keep: int) -> int:
    """Comparisons a core's selection of its best min(m, keep) of m candidates is booked at: every candidate
    sifts through a binary heap of that many entries, ceil(log2(k + 1)) levels deep (a sort when k = m)."""
    return m * math.ceil(math.log2(min(m, keep) + 1)) if m > 1 else 0


def topk_cost(spec: HardwareSpec, row: TopKRow) -> dict[str, Cost]:
    """The closed form of `row_topk` on one row, by booked primitive (add rows with core.cost.on_lines)."""
    senders = row.cores - 1  # every core but the middle sends once
    merge_flops = row.heads * row.keep * row.streams  # the middle merges each stream; the rest overlap in the pipe
    cycles = row.rounds * message_cycles(spec, 1, 1, 0) + row.streams * serialise_cycles(spec, row.message_bytes)
    merge = Cost(hops=row.rounds, stages=row.rounds, link_bytes=senders * row.message_bytes, messages=senders,
                 cycles=cycles) + compute_cost(spec, merge_flops)
    return {"topk.select": compute_cost(spec, row.heads * select_comparisons(row.per_core, row.keep)),
            "topk.merge": merge, "broadcast": broadcast_cost(spec, row.cores, row.message_bytes, row.middle)}


# -- the kernel --------------------------------------------------------------------------------------------
def pack(scores: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """(..., K) float32 scores and int32 positions -> (..., K, 2) float32 (the positions' bits kept)."""
    return np.stack([scores.astype(np.float32), positions.astype(np.int32).view(np.float32)], axis=-1)


def unpack(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `pack`: (..., K, 2) -> scores (..., K) float32, positions (..., K) int32."""
    return buf[..., 0], np.ascontiguousarray(buf[..., 1]).view(np.int32)


def best(scores: np.ndarray, positions: np.ndarray, keep: int) -> np.ndarray:
    """The `keep` highest scores of the last axis, highest first, ties to the lower position -> packed."""
    order = np.lexsort((positions, -scores), axis=-1)[..., :keep]  # (..., keep)
    return pack(np.take_along_axis(scores, order, -1), np.take_along_axis(positions, order, -1))


def buffer_bytes(row: TopKRow) -> int:
    """Bytes a core of the row holds for the top-K besides its scores: its own K best of every head and the K
    a neighbour streams in, 8 bytes an entry (``local_select``'s list and ``merge_round``'s received one)."""
    return 2 * ENTRY_BYTES * row.heads * row.keep


def local_select(ctx, scores: np.ndarray, keep: int, positions: np.ndarray | None = None) -> np.ndarray:
    """Every core's own K best. scores (rows, cols, H, m) -> packed (rows, cols, H, K, 2); `positions`
    (broadcast to scores' shape) the position of each candidate, default core j's j*m .. j*m+m-1."""
    m = scores.shape[-1]
    if positions is None:
        cols = ctx.positions()[0][:, :, None, None]  # (rows, cols, 1, 1): this core's place in the row
        positions = cols * m + np.arange(m)
    record_select(ctx.ledger, scores.shape[-2], m, keep)
    top = best(scores, np.broadcast_to(positions, scores.shape), min(m, keep))  # (rows, cols, H, k, 2)
    if m >= keep:
        return top
    pad = scores.shape[:-1] + (keep - m,)  # padded to K: after every real entry
    return np.concatenate([top, pack(np.full(pad, -np.inf, np.float32), np.full(pad, PAD_POSITION))], axis=-2)


def merge_round(ctx, mine: np.ndarray, step: Round, row: TopKRow) -> np.ndarray:
    """A round of the two chains: the fronts send one hop towards the middle, the receivers merge."""
    col = ctx.positions()[0]  # (rows, cols): place in the row
    got = []
    with ctx.ledger.op("topk.merge"):
        with ctx.ledger.streamed(), ctx.ledger.concurrent():  # entry by entry: serialised once, at the end
            for s in step.sends(row):
                got.append((ctx.send(mine, s.dx, 0, where=col == s.sender), col == s.sender + s.dx))
        for received, here in got:
            at = np.flatnonzero(here.any(axis=0))  # the receiving column, if this tile holds it
            if len(at):
                s, p = unpack(np.concatenate([mine[:, at], received[:, at]], axis=-2))  # (rows, 1, H, 2K)
                mine = mine.copy()
                mine[:, at] = best(s, p, row.keep)
    return mine


def row_topk(ctx, scores: np.ndarray, keep: int, positions: np.ndarray | None = None) -> np.ndarray:
    """The kernel: scores (rows, cols, H, m) -> every core's (rows, cols, H, K, 2) packed row-wide top-K.
    `positions`: each candidate's (as `local_select`'s). The comparisons are of float32 scores: booked at
    float32's rate whatever the ledger's dtype (as `topk_cost`)."""
    row = TopKRow(ctx.region.w, scores.shape[-1], scores.shape[-2], keep)
    with ctx.ledger.at_rate("float32"):
        mine = local_select(ctx, scores, keep, positions)
        for step in merge_rounds(row):
            mine = merge_round(ctx, mine, step, row)
        read_streams(ctx.ledger, row)
    return ctx.broadcast(mine, "x", root=row.middle)


def record_select(ledger, heads: int, m: int, keep: int) -> None:
    """Every core's selection of its best of m candidates for each of `heads` heads (as `select_comparisons`)."""
    with ledger.op("topk.select"):
        ledger.compute(heads * select_comparisons(m, keep))


def read_streams(ledger, row: TopKRow) -> None:
    """The middle core's reading of the chains: each stream's entries serialised and merged once there."""
    if row.streams:
        with ledger.op("topk.merge"):
            ledger.add(Cost(cycles=row.streams * serialise_cycles(ledger.spec, row.message_bytes)))
            ledger.compute(row.heads * row.keep * row.streams)


def record_topk(comm: LineComm, row: TopKRow) -> None:
    """The fast path's top-K on every line of `comm` (rows of row.cores cores): the kernel's schedule run step by
    step and recorded as it goes -- every core's selection, each `merge_rounds` round's one-hop sends (streamed,
    the chains at once), the middle's reading of the streams, its multicast -- without moving the lists (the
    caller picks them with numpy: waferrt.decode.sparse.ranked). `topk_cost` is its closed form (tested)."""
    ledger, lines = comm.ledger, comm.lines
    if ledger.quiet:  # replaying a layer's records (Ledger.replay)
        return
    with ledger.at_rate("float32"):
        record_select(ledger, row.heads, row.per_core, row.keep)
        for step in merge_rounds(row):
            with ledger.op("topk.merge"), ledger.streamed(), ledger.concurrent():
                for s in step.sends(row):
                    ledger.message(comm.topo.step_hops(row.cores, [s.sender], s.dx), row.message_bytes, lines)
        read_streams(ledger, row)
    if row.cores > 1:
        with ledger.op("broadcast"):
            msgs = (row.cores - 1) * lines
            ledger.message(comm.topo.farthest(row.cores, row.middle), row.message_bytes, msgs,
                           link_bytes=msgs * row.message_bytes)
