"""STAR's sparse attention in a layer region's decode: which cached keys each query head attends to.

Contract: these are what a LayerShard's attention (waferrt.decode.shards) runs
under a sparse ``Decoding.attention`` (waferrt.model.sparse.AttentionMode). For a micro-batch whose fullest
request holds L positions it keeps K = ``attention.keys_kept(L)`` keys per query head; when K < L it

1. predicts every visible position's score with the add-only log-domain estimate (q times the keys as signed
   powers of two, ``model.sparse.log_keys``: `predicted`), booked as flops at decode.cost.PREDICT_DTYPE's
   rate (`book_prediction`) and its partial scores' reduce over the rows (as the dense scores' reduce);
2. keeps each item's ``keys_kept(its own context)`` highest-predicted positions, ties to the earlier one
   (``model.sparse.select_top``'s rule: `chosen`), booked as the row's top-K on every row of the region
   (`book_top_k`: ``decode.topk.topk_cost``, selection, streamed merge, multicast; tied to the row_topk kernel);

then attends over the chosen keys (within the visible ones), booked as min(K, m) keys a core: a core holding
m positions may hold that many of the kept ones, and the mesh waits for its busiest core. With
K >= L every visible key is kept and nothing more is booked: the mask is the dense one, so the tokens are
dense's exactly. What is booked is ``decode.cost.sparse_parts`` (tested equal).

On the hop-by-hop collectives (``Collectives(fast=False)``) `hop_selection` runs the same steps message by
message -- the partial predictions' allreduce, the row_topk kernel itself, each core's kept entries gathered
into a block of min(K, m) -- booking what the fast path books (tested equal, with the same outputs).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from waferrt.core.cost import compute_cost, on_lines
from waferrt.fabric.comm import Slices, Span
from waferrt.fabric.kernel import Context
from waferrt.model.sparse import AttentionMode, log_keys

from .cost import PREDICT_DTYPE
from .kvcache import KVView
from .topk import TopKRow, row_topk, topk_cost, unpack


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


def fast_view(shard, qg: np.ndarray, items, view: KVView) -> KVView:
    """The prediction and the row's top-K on the fast path: qg (B, nkv, rep, R, hd_r); `view` (the PositionEntries
    layout's) -> the view whose mask hides what each query head does not keep, a core running over min(K, held) keys."""
    L, held, slots = items.length, view.held, items.slots
    qf = shard.net.split(qg)  # (B, nkv, rep, R*hd_r)
    keep, (uniq, which) = shard.attention.keys_kept(L), np.unique(slots, return_inverse=True)
    row = TopKRow(shard.cols, held, qf.shape[0] * qf.shape[1] * qf.shape[2], keep)
    visible = ~view.hidden
    pred = predicted(qf, (shard.kv.layout.read(uniq, L)[0], which), visible)  # (B, nkv, rep, L)
    book_prediction(shard.ledger, row, shard.hd_r)
    shard.net.allreduced(shard.cy, row.heads * held * shard.cols)  # the partial predictions, over the rows
    book_top_k(shard.ledger, row, shard.rows)
    return replace(view, hidden=~(visible & chosen(pred, items.poss, shard.attention)), held=min(keep, held))


def hop_view(shard, qg: np.ndarray, items, view: KVView) -> KVView:
    """The same hop by hop (`hop_selection`): qg (B, nkv, rep, R, hd_r) -> a view of a block of min(K, held)
    kept keys per query head: K (B, nkv, rep, R, hd_r, C, w), V (B, nkv, rep, C, w, R*hd_r)."""
    slots, poss, m = items.slots, items.poss, view.held
    cores = shard.kv.layout  # kv_layouts.CoreEntries
    held = (*cores.read(slots, m), cores.visible(slots, poss, m))
    qh = qg.transpose(0, 3, 1, 2, 4)  # (B, R, nkv, rep, hd_r)
    k, v, kept, w = hop_selection(shard, qh, (slots, poss), held)
    B, R, nkv, rep, hd_r = qh.shape
    k = k.reshape(B, R, nkv, rep, hd_r, w, shard.cols).transpose(0, 2, 3, 1, 4, 6, 5)
    hidden = ~kept.transpose(0, 1, 2, 4, 3)[:, :, :, None]  # (B, nkv, rep, 1, C, w)
    return KVView(k, v.transpose(0, 2, 3, 1, 4, 5), hidden, w, per_head=True)


def book_prediction(ledger, row: TopKRow, hd_r: int) -> None:
    """The prediction's flops on the busiest core (at PREDICT_DTYPE's rate): every head's held positions."""
    ledger.add(compute_cost(ledger.spec, 2 * row.heads * hd_r * row.per_core, PREDICT_DTYPE))


def book_top_k(ledger, row: TopKRow, lines: int) -> None:
    """The row's top-K (decode.topk's closed form, tied to its kernel) on `lines` rows at once."""
    for c in topk_cost(ledger.spec, row).values():
        ledger.add(on_lines(c, lines))


# -- the hop-by-hop path (Collectives(fast=False)): every message sent --------------------------------------
def hop_selection(shard, qg: np.ndarray, at: tuple[np.ndarray, np.ndarray], held: tuple) -> tuple:
    """The prediction, the row's top-K and the kept keys of a LayerShard's hop-by-hop attention, every message
    sent: each core's partial predictions reduced over the rows (a LineComm allreduce, as the scores), the
    decode.topk.row_topk kernel on every row of the region (candidates named by their token positions, so ties
    go to the earlier one as on the fast path), then each core's kept entries gathered to the front of a block of
    w = min(K, m) (the most any core holds). qg (B, R, nkv, rep, hd_r); at = (slots, poss); held = (kc (B, R, nkv,
    hd_r, m*C), vc (B, C, nkv, m, R*hd_r), visible (B, m, C)) as CoreEntries.read/visible give them -> (kc (B, R,
    nkv, rep, hd_r, w*C), vc (B, C, nkv, rep, w, R*hd_r), visible (B, nkv, rep, w, C), w): one block per head."""
    (slots, poss), (kc, vc, visible) = at, held
    B, R, nkv, rep, hd_r = qg.shape
    m, C, keep = visible.shape[1], shard.cols, shard.attention.keys_kept(int(poss.max()) + 1)
    row = TopKRow(C, m, B * nkv * rep, keep)
    book_prediction(shard.ledger, row, hd_r)
    part = np.matmul(qg, log_keys(kc)).reshape(B, R, nkv, rep, m, C)  # every core's partial predictions
    pred = shard.cy.allreduce(part, shard.coll, slices=Slices(1), collapse=True, overwrite=True)  # (B, nkv, rep, m, C)
    pred = np.where(visible[:, None, None], pred, np.float32(-np.inf))
    cand = np.broadcast_to(pred.transpose(4, 0, 1, 2, 3).reshape(C, row.heads, m), (R, C, row.heads, m))
    pos = shard.kv.layout.pos[slots, :m]  # (B, m, C): the token position of each entry
    positions = np.broadcast_to(pos.transpose(2, 0, 1)[:, :, None, None], (C, B, nkv, rep, m))
    tops = row_topk(Context(Span.of(shard.region), shard.ledger, {}), cand, keep,
                    positions.reshape(C, row.heads, m)[None])
    best = unpack(tops)[1][0, 0].reshape(B, nkv, rep, keep)  # every core of every row holds the same lists
    share = np.array([shard.attention.keys_kept(int(p) + 1) for p in poss])[:, None, None, None]  # (B, 1, 1, 1)
    best = np.where(np.arange(keep) < share, best, -1)  # each item keeps its own context's share
    entry = shard.kv.layout.pos[slots, :m][:, None, None]  # (B, 1, 1, m, C): the token position of each entry
    kept = visible[:, None, None] & (entry[..., None] == best[:, :, :, None, None]).any(axis=-1)  # (B, nkv, rep, m, C)
    w = min(keep, m)
    idx = np.argsort(~kept, axis=3, kind="stable")[:, :, :, :w]  # (B, nkv, rep, w, C): the kept entries first
    k = np.take_along_axis(kc.reshape(B, R, nkv, 1, hd_r, m, C), idx[:, None, :, :, None], axis=5)
    v = np.take_along_axis(vc[:, :, :, None], idx.transpose(0, 4, 1, 2, 3)[..., None], axis=4)
    return k.reshape(B, R, nkv, rep, hd_r, w * C), v, np.take_along_axis(kept, idx, axis=3), w
