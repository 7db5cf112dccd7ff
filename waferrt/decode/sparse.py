"""STAR's sparse attention in a layer region's decode: which cached keys each query head attends to.

Contract: these are what a LayerShard's fast-path attention (waferrt.decode.shards) runs
under a sparse ``Decoding.attention`` (waferrt.model.sparse.AttentionMode). For a micro-batch whose fullest
request holds L positions it keeps K = ``attention.keys_kept(L)`` keys per query head; when K < L it

1. predicts every visible position's score with the add-only log-domain estimate (q times the keys as signed
   powers of two, ``model.sparse.log_keys``: `predicted`), booked as flops at decode.cost.PREDICT_DTYPE's
   rate (`book_prediction`) and its partial scores' reduce over the rows (as the dense scores' reduce);
2. keeps each item's ``keys_kept(its own context)`` highest-predicted positions, ties to the earlier one
   (``model.sparse.select_top``'s rule: `chosen`), booked as the row's top-K on every row of the region
   (`book_top_k`: ``decode.topk.topk_cost``, selection, streamed merge, multicast; tied to the row_topk kernel);

then attends over the chosen keys (within the visible ones), booked as ``cdiv(K, cols)`` keys a core (taken
as spread evenly over the columns). With
K >= L every visible key is kept and nothing more is booked: the mask is the dense one, so the tokens are
dense's exactly. What is booked is ``decode.cost.sparse_parts`` (tested equal).
"""

from __future__ import annotations

import numpy as np

from waferrt.core.cost import compute_cost, on_lines
from waferrt.model.sparse import AttentionMode, log_keys

from .cost import PREDICT_DTYPE
from .topk import TopKRow, topk_cost


def predicted(qg: np.ndarray, keys: tuple[np.ndarray, np.ndarray], visible: np.ndarray) -> np.ndarray:
    """The add-only predicted scores of the items' query heads against their requests' keys, -inf where not
    visible. qg (B, nkv, rep, D); keys: kc (U, nkv, D, L) of the U distinct requests and which of them each
    item's is (B,); visible (B, 1, 1, L) -> (B, nkv, rep, L) float32. A request's keys go to the log domain
    once, however many of its items (a prompt's) attend."""
    kc, which = keys
    pred = np.empty(qg.shape[:3] + kc.shape[-1:], np.float32)
    for u, logk in enumerate(log_keys(kc)):  # (nkv, D, L)
        items = which == u
        pred[items] = np.matmul(qg[items], logk)  # (n, nkv, rep, D) @ (nkv, D, L)
    return np.where(visible, pred, np.float32(-np.inf))


def chosen(pred: np.ndarray, poss: np.ndarray, attention: AttentionMode) -> np.ndarray:
    """The mask of each item's keys_kept(its context) highest-predicted positions, ties to the earlier one
    (what a stable sort keeps), by selection: every score above the k-th highest, then the earliest of those
    equal to it. pred (B, nkv, rep, L); poss (B,) -> (B, nkv, rep, L) bool."""
    kept = np.array([attention.keys_kept(int(p) + 1) for p in poss])  # (B,)
    out = np.zeros(pred.shape, bool)
    for k in np.unique(kept).tolist():
        sel = np.flatnonzero(kept == k)
        p = pred[sel]  # (n, nkv, rep, L)
        kth = -np.partition(-p, k - 1, axis=-1)[..., k - 1:k]  # (n, nkv, rep, 1): the k-th highest
        above, tie = p > kth, p == kth
        room = k - np.count_nonzero(above, axis=-1)[..., None]  # how many of the equal ones still fit
        out[sel] = above | (tie & (np.cumsum(tie, axis=-1) <= room))
    return out


def book_prediction(ledger, row: TopKRow, hd_r: int) -> None:
    """The prediction's flops on the busiest core (at PREDICT_DTYPE's rate): every head's held positions."""
    ledger.add(compute_cost(ledger.spec, 2 * row.heads * hd_r * row.per_core, PREDICT_DTYPE))


def book_top_k(ledger, row: TopKRow, lines: int) -> None:
    """The row's top-K (decode.topk's closed form, tied to its kernel) on `lines` rows at once."""
    for c in topk_cost(ledger.spec, row).values():
        ledger.add(on_lines(c, lines))
