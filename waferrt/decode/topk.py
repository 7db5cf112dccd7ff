"""STAR's distributed top-K along a row of cores: each core sorts its own candidates, then a merge across
neighbours (issue 22, step 3).

Contract: a row of n cores holds a request's positions, m per core (core j holds positions j*m .. j*m+m-1),
and for each of H query heads every core has its positions' predicted scores (``scores`` block (H, m)).
`row_topk(ctx, scores, keep)` leaves on every core of the row the `keep` highest-scoring positions of the
whole row per head, highest first, ties to the earlier position: exactly
``waferrt.model.sparse.select_top`` over the row's concatenated scores. How:

1. local sort: each core sorts its m candidates and keeps its best min(m, K), padded to K (``-inf`` at a
   position past every real one), booked as ``topk.sort``: H * m*ceil(log2 m) comparisons;
2. merge: two chains run towards the middle core c = (n-1)//2, one from each end; each round every chain's
   front core sends its K best (scores and positions: 8 bytes an entry) ONE hop to its neighbour, which
   merges them with its own (K comparisons per head, 2K at the middle when both chains arrive in the same
   round). The two chains' messages travel at once (one routing stage). ceil((n-1)/2) rounds, booked as
   ``topk.merge``;
3. the middle core multicasts the K winners along the row (router multicast), ``broadcast``.

`topk_cost(spec, row)` is the closed form of the three, from ``core.cost``'s owners only (``compute_cost``,
``message_cycles`` and ``broadcast_cost``); `topk_cost` equals what the kernel books (tested).
`attention_parts` models one token's attention in a layer region, dense or sparse (prediction, sort,
attention over the K chosen keys), from ``decode.cost``'s parts and the owners above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, broadcast_cost, compute_cost, message_cycles, on_lines
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import Decoding, layer_decode_parts, layer_dims

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


def sort_comparisons(m: int) -> int:
    """Comparisons a core's sort of m candidates is booked at: m * ceil(log2 m) (a merge sort's bound)."""
    return m * math.ceil(math.log2(m)) if m > 1 else 0


def topk_cost(spec: HardwareSpec, row: TopKRow) -> dict[str, Cost]:
    """The closed form of `row_topk` on one row, by booked primitive (add rows with core.cost.on_lines)."""
    senders = row.cores - 1  # every core but the middle sends once
    both_arrive = 1 if row.middle == row.rounds and row.cores > 1 else 0  # n odd: the last round merges twice
    merge_flops = row.heads * row.keep * (row.rounds + both_arrive)
    merge = Cost(hops=row.rounds, stages=row.rounds, link_bytes=senders * row.message_bytes, messages=senders,
                 cycles=row.rounds * message_cycles(spec, 1, 1, row.message_bytes)) + compute_cost(spec, merge_flops)
    return {"topk.sort": compute_cost(spec, row.heads * sort_comparisons(row.per_core)),
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


def local_sort(ctx, scores: np.ndarray, keep: int) -> np.ndarray:
    """Every core's own K best. scores (rows, cols, H, m) -> packed (rows, cols, H, K, 2)."""
    m = scores.shape[-1]
    cols = ctx.positions()[0][:, :, None, None]  # (rows, cols, 1, 1): this core's place in the row
    positions = np.broadcast_to(cols * m + np.arange(m), scores.shape)  # (rows, cols, H, m)
    pad = max(0, keep - m)
    scores = np.concatenate([scores, np.full(scores.shape[:-1] + (pad,), -np.inf, np.float32)], axis=-1)
    positions = np.concatenate([positions, np.full(positions.shape[:-1] + (pad,), PAD_POSITION)], axis=-1)
    with ctx.ledger.op("topk.sort"):
        ctx.ledger.compute(scores.shape[-2] * sort_comparisons(m))
    return best(scores, positions, keep)


def merge_round(ctx, mine: np.ndarray, r: int, row: TopKRow) -> np.ndarray:
    """Round r (1-based) of the two chains: the fronts send one hop towards the middle, the receivers merge."""
    col = ctx.positions()[0]  # (rows, cols): place in the row
    east, west = r <= row.middle, r <= row.rounds  # which chains still move this round
    got = []
    with ctx.ledger.op("topk.merge"):
        with ctx.ledger.concurrent():
            if east:
                got.append((ctx.send(mine, 1, 0, where=col == r - 1), col == r))
            if west:
                got.append((ctx.send(mine, -1, 0, where=col == row.cores - r), col == row.cores - 1 - r))
        for received, here in got:
            s, p = unpack(np.concatenate([mine, received], axis=-2))  # (rows, cols, H, 2K)
            mine = np.where(here[:, :, None, None, None], best(s, p, row.keep), mine)
        ctx.ledger.compute(row.heads * row.keep * (2 if 2 * r == row.cores - 1 else 1))  # the busiest core
    return mine


def row_topk(ctx, scores: np.ndarray, keep: int) -> np.ndarray:
    """The kernel: scores (rows, cols, H, m) -> every core's (rows, cols, H, K, 2) packed row-wide top-K."""
    row = TopKRow(ctx.region.w, scores.shape[-1], scores.shape[-2], keep)
    mine = local_sort(ctx, scores, keep)
    for r in range(1, row.rounds + 1):
        mine = merge_round(ctx, mine, r, row)
    return ctx.broadcast(mine, "x", root=row.middle)


# -- a layer's attention, dense or sparse, on a decode region (modelled time) ------------------------------
PREDICT_DTYPE = "float16"  # the prediction's operands: 8-bit exponents and a 16-bit shifted query


def attention_parts(spec: HardwareSpec, dec: Decoding, region: Region, kv_tokens: int,
                    keep: int | None = None) -> dict[str, Cost]:
    """One token's attention in one layer region (the decode layout: positions along the columns, head
    dimension along the rows), as named Costs. Dense (keep None): the "attention" parts of
    ``decode.cost.layer_decode_parts``. Sparse: the add-only prediction over every position (one exponent
    add and one add per element, at the 16-bit rate, its partial scores reduced over the rows as the scores
    are), the row's top-K (`topk_cost` on every row of the region), then the dense parts over the K chosen
    keys, assumed spread evenly over the columns (K/cols a core; clustered keys would cost more)."""
    def attention(tokens: int) -> Cost:
        return sum((c for _, cat, c in layer_decode_parts(spec, dec, region, tokens) if cat == "attention"), Cost())

    if keep is None or keep >= kv_tokens:
        return {"attention": attention(kv_tokens)}
    d = layer_dims(dec.config, region.w, region.h, dec.head_groups)
    cap, hq, r = cdiv(kv_tokens, region.w), d["hq"], d["group_rows"]
    predict = compute_cost(spec, 2 * hq * d["hd_r"] * cap, PREDICT_DTYPE) + dec.line_reduce(
        spec, r, 4 * hq * cap, region.w * (region.h // r))
    row = TopKRow(region.w, cap, hq, keep)
    sort = on_lines(sum(topk_cost(spec, row).values(), Cost()), region.h)
    return {"predict": predict, "sort": sort, "attention": attention(keep)}
