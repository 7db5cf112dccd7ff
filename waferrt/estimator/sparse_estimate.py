"""STAR's sparse attention on a whole wafer, on paper: where it starts to pay, what it saves, what fits.

Contract: :func:`sparse_estimate(est, mode)` takes an :class:`~scheduler.estimate_report.Estimate` that fits
and a sparse :class:`~waferrt.model.sparse.AttentionMode` and returns a :class:`SparseEstimate`: one layer's
attention on the estimate's layer region (``decode.cost.attention_parts``: dense, and sparse's prediction,
top-K and attention over the kept keys) at every context from ``FIRST_CONTEXT`` doubling up to the most
K/V positions a request can hold (``est.kv_tokens_per_request``) -- and on, on the same region as if its
SRAM held more, until sparse is cheaper or ``LONGEST_SWEPT`` -- the context from which sparse is cheaper
(`pays_from`, None when it never is in that range), and one token's time at the estimate's own
K/V reserve, dense (the estimate's) and sparse (the estimate's with every layer's attention swapped: a
token passes the layers one after another). Sparse attention keeps every key in SRAM (it reads K of
them) and its cores hold the top-K's lists besides (decode.layout.topk_booking: 2 x heads x K x 8 bytes), so
the longest context that fits (`longest_context`, ``wafer.shape_kv_capacity`` under the mode) is at most the
dense estimate's ``est.kv_tokens_per_request``, with ``est.kv.requests`` in flight.
``lines()`` is what ``waferrt estimate --attention sparse:K`` prints after the estimate, ``to_json()`` its
``"sparse"`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from waferrt.core.cost import cycles_seconds
from waferrt.decode.cost import attention_parts
from waferrt.decode.decoding import Decoding
from waferrt.model.sparse import AttentionMode
from waferrt.scheduler.types import Workload

from .estimate import paper_decoding
from .estimate_report import Estimate
from .wafer import shape_kv_capacity

FIRST_CONTEXT = 256  # the sweep's first context (then doubling)
LONGEST_SWEPT = 1 << 22  # past the longest context that fits, the sweep goes on until sparse pays, up to this


@dataclass(frozen=True)
class ContextRow:
    context: int
    dense_cycles: float  # one layer's attention for one token
    sparse_cycles: float
    predict_cycles: float
    sort_cycles: float


@dataclass(frozen=True)
class SparseEstimate:
    label: str
    mode: AttentionMode
    rows: tuple[ContextRow, ...]
    longest_context: int  # K/V positions a request holds under sparse (its top-K's lists held too)
    dense_longest: int  # ... and dense
    dense_token_s: float  # one request's token at the estimate's K/V reserve
    sparse_token_s: float

    def __post_init__(self) -> None:
        if self.mode.dense:
            raise ValueError("a SparseEstimate is of a sparse attention mode (sparse:K or sparse:F)")

    @property
    def pays_from(self) -> int | None:
        """The shortest context of the sweep from which sparse is cheaper at every longer one, or None."""
        cheaper = [r.sparse_cycles < r.dense_cycles for r in self.rows]
        if not cheaper or not cheaper[-1]:
            return None
        i = len(cheaper) - 1
        while i > 0 and cheaper[i - 1]:
            i -= 1
        return self.rows[i].context

    def lines(self) -> list[str]:
        pays = self.pays_from
        where = f"from {pays:,} positions on" if pays else f"at no context up to {self.rows[-1].context:,}"
        out = [f"attention       {self.mode}: one layer's attention per token, cycles (dense -> sparse: predict + "
               f"top-K + attend); sparse pays {where}"]
        out += [self._line(r) for r in self.rows]
        if pays is None:
            r = self.rows[-1]
            out.append(f"  why: sparse costs at least its prediction and top-K; at {r.context:,} the prediction and "
                       f"its reduce alone are {r.predict_cycles / r.dense_cycles:.0%} of dense's attention, leaving "
                       f"{r.dense_cycles - r.predict_cycles:,.0f} cycles to win, and the top-K costs "
                       f"{r.sort_cycles:,.0f} (benchmarks/sparse_attention.py --where-pays: by term)")
        out.append(f"  a token at the reserve: {self.dense_token_s * 1e6:,.1f} us dense, "
                   f"{self.sparse_token_s * 1e6:,.1f} us {self.mode}; the longest context that fits: "
                   f"{self.dense_longest:,} positions a request dense, {self.longest_context:,} sparse (every key "
                   "stays in SRAM, and the top-K's lists)")
        return out

    def _line(self, r: ContextRow) -> str:
        attend = r.sparse_cycles - r.predict_cycles - r.sort_cycles
        beyond = "" if r.context <= self.longest_context else " (beyond what fits)"
        return (f"  {r.context:>9,} positions  {r.dense_cycles:>12,.0f} -> {r.sparse_cycles:>12,.0f} "
                f"({r.predict_cycles:,.0f} + {r.sort_cycles:,.0f} + {attend:,.0f})  "
                f"x{r.dense_cycles / r.sparse_cycles:.2f}{beyond}")

    def to_json(self) -> dict:
        return {"mode": str(self.mode), "pays_from": self.pays_from, "longest_context": self.longest_context,
                "dense_longest_context": self.dense_longest,
                "dense_token_s": self.dense_token_s, "sparse_token_s": self.sparse_token_s,
                "contexts": [vars(r) for r in self.rows]}


def sparse_estimate(est: Estimate, mode: AttentionMode) -> SparseEstimate:
    """The sparse figures of an estimate that fits (see the module docstring)."""
    if not est.fits:
        raise ValueError(f"{est.label} does not fit, so its attention has no region to be timed on")
    dense = paper_decoding(est.config, est.dtype, est.shape.head_groups)
    sparse = replace(dense, attention=mode)
    work = Workload(est.config, est.kv, est.dtype, est.strategy.group)
    longest = shape_kv_capacity(work, est.shape, est.spec.sram_bytes, mode)  # the top-K's lists held too
    contexts = [FIRST_CONTEXT * 2 ** i for i in range(64) if FIRST_CONTEXT * 2 ** i < longest] + [longest]
    rows = [_row(est, dense, sparse, n) for n in contexts]
    while rows[-1].sparse_cycles >= rows[-1].dense_cycles and rows[-1].context < LONGEST_SWEPT:
        rows.append(_row(est, dense, sparse, 2 * rows[-1].context))  # beyond what fits: where it would pay
    at = _row(est, dense, sparse, est.kv.tokens)
    swap = cycles_seconds(est.spec, est.config.n_layers * (at.sparse_cycles - at.dense_cycles))
    return SparseEstimate(est.label, mode, tuple(rows), longest, est.kv_tokens_per_request, est.time_per_token_s,
                          est.time_per_token_s + swap)


def _row(est: Estimate, dense: Decoding, sparse: Decoding, context: int) -> ContextRow:
    """One layer's attention for one token at `context` positions on the estimate's layer region, `dense` and
    `sparse`."""
    region = est.shape.region()
    dense_cycles = sum(c.cycles for c in attention_parts(est.spec, dense, region, context).values())
    parts = attention_parts(est.spec, sparse, region, context)
    predict = sum(c.cycles for n, c in parts.items() if n.startswith("predict"))
    sort = sum(c.cycles for n, c in parts.items() if n.startswith(("topk", "broadcast")))
    return ContextRow(context, dense_cycles, sum(c.cycles for c in parts.values()), predict, sort)
