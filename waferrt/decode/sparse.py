"""STAR's sparse attention in a layer region's decode: which cached keys each query head attends to.

Contract: these are what a LayerShard's attention (waferrt.decode.shards) runs
under a sparse ``Decoding.attention`` (waferrt.model.sparse.AttentionMode). For a micro-batch whose fullest
request holds L positions it keeps K = ``attention.keys_kept(L)`` keys per query head; when K < L it

1. predicts every visible position's score with the add-only log-domain estimate (q times the keys as signed
   powers of two, ``model.sparse.log_keys``: `predicted`), recorded by ``net.predict`` as it runs, at
   decode.cost.PREDICT_DTYPE's rate, and its partial scores' reduce over the rows (as the dense scores' reduce);
2. keeps each item's ``keys_kept(its own context)`` highest-predicted positions, ties to the earlier one
   (``model.sparse.select_top``'s rule: `ranked`), recorded as the row's top-K on every row of the region
   (``decode.topk.record_topk``: the row_topk kernel's schedule -- selection, streamed merge, multicast -- step
   by step; ``decode.topk.topk_cost`` is its closed form, tied to it);
3. gathers each query head's kept keys and values in predicted order (`ranked`) and scores them alone -- the
   dense Q.K^T is never computed -- then combines them with STAR's sorted-updating FlashAttention (`flash`:
   ``kernels.sparse_attention.flash``: the online softmax, 16 keys a step, each core over its own kept keys),
   the cores' running maxes, sums and P.V merged over the row (`merged`);

booked as min(K, m) keys a core: a core holding m positions may hold that many of the kept ones, and the mesh
waits for its busiest core. With K >= L the layer runs dense attention (decode.shards), so the tokens are
dense's exactly. What is booked is ``decode.cost.sparse_parts`` (tested equal).

`fast_attend` holds the kept keys joined (one online softmax over a head's K keys, as the reference's). On the
hop-by-hop collectives (``Collectives(fast=False)``) `hop_attend` runs the same steps message by message
(`hop_selection`): the partial predictions' allreduce, the row_topk kernel itself, each core's kept entries
gathered into a block of min(K, m) in predicted order, each core's `flash` over its block and the merge's
allreduces -- booking what the fast path books (tested equal, with the same outputs to float32 rounding).
"""

from __future__ import annotations

import functools

import numpy as np

from waferrt.fabric.comm import Slices, Span
from waferrt.fabric.kernel import Context
from waferrt.kernels.sparse_attention import Partial, row_statistics
from waferrt.model.sparse import AttentionMode, log_keys

from .kv_layouts import HeldEntries
from .kvcache import KVView
from .topk import TopKRow, record_topk, row_topk, unpack


def predicted(qg: np.ndarray, kc: np.ndarray, which: np.ndarray, visible: np.ndarray, product=np.matmul
              ) -> np.ndarray:
    """The add-only predicted scores of the items' query heads against their requests' keys, -inf where not
    visible. qg (B, nkv, rep, D); kc (U, nkv, D, L) the keys of the U distinct requests, `which` (B,) of them each
    item's is; visible (B, 1, 1, L) -> (B, nkv, rep, L) float32. A request's keys go to the log domain once,
    however many of its items (a prompt's) attend. `product`: the layer's ``net.predict`` (which records it),
    np.matmul outside a layer."""
    pred = np.empty(qg.shape[:3] + kc.shape[-1:], np.float32)
    for u, logk in enumerate(log_keys(kc)):  # (nkv, D, L)
        items = which == u
        pred[items] = product(qg[items], logk)  # (n, nkv, rep, D) @ (nkv, D, L)
    return np.where(visible, pred, np.float32(-np.inf))


def ranked(pred: np.ndarray, poss: np.ndarray, attention: AttentionMode) -> tuple[np.ndarray, np.ndarray]:
    """Each query head's keys_kept(L) highest-predicted positions, highest first, ties to the earlier one (a
    stable sort: ``model.sparse.select_top``'s rule), and which of them the item keeps (its own context's share).
    pred (B, nkv, rep, L); poss (B,) -> order (B, nkv, rep, K) int, kept (B, 1, 1, K) bool."""
    share = np.array([attention.keys_kept(int(p) + 1) for p in poss])  # (B,)
    keep = attention.keys_kept(pred.shape[-1])
    kth = -np.partition(-pred, keep - 1, axis=-1)[..., keep - 1:keep]  # (B, nkv, rep, 1): the K-th highest
    above, tie = pred > kth, pred == kth
    room = keep - np.count_nonzero(above, axis=-1)[..., None]  # how many of the equal ones still fit
    top = np.nonzero(above | (tie & (np.cumsum(tie, axis=-1) <= room)))[-1].reshape(pred.shape[:-1] + (keep,))
    ranks = np.argsort(-np.take_along_axis(pred, top, axis=-1), axis=-1, kind="stable")  # ties: the earlier first
    return np.take_along_axis(top, ranks, axis=-1), np.arange(keep) < share[:, None, None, None]


def merged(shard, part: Partial, s: np.ndarray, w: int) -> np.ndarray:
    """The cores' Partials combined over the x-line: the max, then the sums and the P.V rescaled to it -> (B, nkv,
    rep, D). Recorded as dense attention records its softmax and P.V over w = min(K, m) keys a core: the max's
    and sum's reduces, the softmax's element-wise work on s, each core's P.V over its w keys (recorded by
    ``net.flash`` as it runs) and the allreduce of the partial P.V sums. Fast: part (B, nkv, rep, ...) joined;
    hop by hop: (B, nkv, rep, C, ...)."""
    net, cx = shard.net, shard.cx
    _, total, f = row_statistics(net, cx, part)  # the row's sum; each core's rescale to the row's max
    net.elementwise(cx, "softmax", s, w)
    acc = part.acc * f
    if net.fast:
        net.allreduced(cx, acc.size)
    else:  # (B, nkv, rep, C, 1, D): each core's partial sums, allreduced message by message as net.dot does
        acc = cx.allreduce(acc[:, :, :, :, None], shard.coll, slices=Slices(3), collapse=True, overwrite=True)
        acc, total = acc[:, :, :, 0], total[..., 0]
    return acc / total


def fast_attend(shard, qg: np.ndarray, items, view: KVView) -> np.ndarray:
    """The prediction, the row's top-K and the attention over the kept keys on the fast path: qg (B, nkv, rep, R,
    hd_r); `view` (the PositionEntries layout's) -> (B, nkv, rep, R*hd_r). Each head's K kept keys and values are
    gathered in predicted order and scored alone (no dense Q.K^T), a core running over min(K, held) of them."""
    L, held, slots = items.length, view.held, items.slots
    qf = shard.net.split(qg)  # (B, nkv, rep, R*hd_r)
    keep, (uniq, which) = shard.attention.keys_kept(L), np.unique(slots, return_inverse=True)
    row = TopKRow(shard.cols, held, qf.shape[0] * qf.shape[1] * qf.shape[2], keep)
    product = functools.partial(shard.net.predict, shard.cy, positions=held)  # over the rows, as the scores
    pred = predicted(qf, shard.kv.layout.read(uniq, L)[0], which, ~view.hidden, product)  # (B, nkv, rep, L)
    shard.net.allreduced(shard.cy, row.heads * held * shard.cols)  # the partial predictions, over the rows
    record_topk(shard.cx, row)  # the row_topk kernel's schedule, recorded step by step
    order, kept = ranked(pred, items.poss, shard.attention)  # (B, nkv, rep, K)
    at = (np.arange(len(order))[:, None, None, None], np.arange(order.shape[1])[None, :, None, None], order)
    ks = view.k.swapaxes(-1, -2)[at].swapaxes(-1, -2)  # (B, nkv, rep, R*hd_r, K): whole rows of the cache
    vs = view.v[at]  # (B, nkv, rep, K, R*hd_r)
    w = min(keep, held)
    s = shard.net.dot(shard.cy, qf[:, :, :, None], ks, w)[:, :, :, 0] * shard.scale  # (B, nkv, rep, K)
    return merged(shard, shard.net.flash(shard.cx, s, kept, vs, w), s, w)


def hop_attend(shard, qg: np.ndarray, items, view: KVView) -> np.ndarray:
    """The same hop by hop (`hop_selection`): qg (B, nkv, rep, R, hd_r) -> (B, nkv, rep, R*hd_r). Each core scores
    its block of w = min(K, held) kept keys per query head, runs `flash` over them in predicted order, and the
    cores' Partials are combined over the x-line (`merged`)."""
    held = shard.kv.layout.held_entries(items, view.held)  # kv_layouts.CoreEntries: every core's own entries
    qh = qg.transpose(0, 3, 1, 2, 4)  # (B, R, nkv, rep, hd_r)
    k, v, kept, w = hop_selection(shard, qh, items, held)
    B, R, nkv, rep, hd_r = qh.shape
    k = k.reshape(B, R, nkv, rep, hd_r, w, shard.cols).transpose(0, 2, 3, 1, 4, 6, 5)  # (B, nkv, rep, R, hd_r, C, w)
    s = shard.net.dot(shard.cy, qg[:, :, :, None], k, w)[:, :, :, 0] * shard.scale  # (B, nkv, rep, C, w)
    vc = v.transpose(0, 2, 3, 1, 4, 5)  # (B, nkv, rep, C, w, R*hd_r)
    part = shard.net.flash(shard.cx, s, kept.transpose(0, 1, 2, 4, 3), vc)  # per core: (B, nkv, rep, C, .)
    return merged(shard, part, s, w)


# -- the hop-by-hop path (Collectives(fast=False)): every message sent --------------------------------------
def hop_selection(shard, qg: np.ndarray, items, held: HeldEntries) -> tuple:
    """The prediction, the row's top-K and the kept keys of a LayerShard's hop-by-hop attention, every message
    sent: each core's partial predictions reduced over the rows (a LineComm allreduce, as the scores), the
    decode.topk.row_topk kernel on every row of the region (candidates named by their token positions, so ties
    go to the earlier one as on the fast path), then each core's kept entries gathered to the front of a block of
    w = min(K, m) (the most any core holds). qg (B, R, nkv, rep, hd_r); `items` (shards.Items) their slots and
    positions; `held` what the cores hold of them (CoreEntries.held_entries: K (B, R, nkv, hd_r, m*C), V (B, C,
    nkv, m, R*hd_r), visible (B, m, C)) -> (kc (B, R, nkv, rep, hd_r, w*C), vc (B, C, nkv, rep, w, R*hd_r),
    visible (B, nkv, rep, w, C), w): one block per head."""
    slots, poss, kc, vc, visible = items.slots, items.poss, held.k, held.v, held.visible
    B, R, nkv, rep, hd_r = qg.shape
    m, C, keep = visible.shape[1], shard.cols, shard.attention.keys_kept(int(poss.max()) + 1)
    row = TopKRow(C, m, B * nkv * rep, keep)
    part = shard.net.predict(shard.cy, qg, log_keys(kc)).reshape(B, R, nkv, rep, m, C)  # every core's partials
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
    entry = pos[:, None, None]  # (B, 1, 1, m, C)
    kept = visible[:, None, None] & (entry[..., None] == best[:, :, :, None, None]).any(axis=-1)  # (B, nkv, rep, m, C)
    w = min(keep, m)
    rank = np.where(kept, -pred, np.float32(np.inf))  # kept entries first, highest predicted first, ties oldest
    idx = np.argsort(rank, axis=3, kind="stable")[:, :, :, :w]  # (B, nkv, rep, w, C)
    k = np.take_along_axis(kc.reshape(B, R, nkv, 1, hd_r, m, C), idx[:, None, :, :, None], axis=5)
    v = np.take_along_axis(vc[:, :, :, None], idx.transpose(0, 4, 1, 2, 3)[..., None], axis=4)
    return k.reshape(B, R, nkv, rep, hd_r, w * C), v, np.take_along_axis(kept, idx, axis=3), w
