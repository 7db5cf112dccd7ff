"""STAR's sparse attention in the MeshGEMM prefill: which keys each prompt query attends to (issue 22).

Contract: for a prompt's chunk whose context (prompt.start + prompt.tokens positions) is longer than the
K = ``attention.keys_kept(context)`` keys a query keeps, `selector(attention, prompt)` is the ``select`` hook
of waferrt.kernels.attention.causal_attention (None otherwise: the dense kernel, dense's output exactly). On the
square of s x s cores, with K already skewed (core (i, c) holds key block j = (i + c) % s, the A layout):

1. predict: the transposed MeshGEMM of Q with each core's own K block in the log domain
   (``model.sparse.log_keys``: sign and leading-one exponent, no message), so row i of the square ends with
   query block i's predicted scores against every key block -- its blocks move as the scores' do, its products
   (exponent additions) booked at decode.cost.PREDICT_DTYPE's rate; the causal mask applied;
2. the row's top-K: decode.topk.row_topk, the decode's kernel (each core selects its best, the streamed merge
   towards the middle, the multicast), over every (head, query) row of the block at once, each candidate
   named by its key position;
3. each query keeps the first ``keys_kept(its own context)`` of its row's list (the reference's per-query
   rule: ``model.sparse.select_top``, ties to the earlier position) -> the Selection, over which the softmax
   and P.V run, a core computing at most min(kb, K) of a query's keys a step (``AttentionShape.kept``).

`prefill_attention_parts` is the closed form of the whole attention, dense or sparse (one owner: what
decode.prefill's ``prefill_work_parts`` lists and the kernels book; tested equal).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, on_lines
from waferrt.core.gemm_cost import AttentionShape, RingOperand, attention_cost, transposed_cost
from waferrt.core.spec import HardwareSpec
from waferrt.kernels.attention import PromptAttention, causal_mask, held_blocks, scores_nt
from waferrt.kernels.sparse_attention import Selection
from waferrt.model.sparse import AttentionMode, log_keys

from .cost import PREDICT_DTYPE
from .decoding import ELEMENTWISE_FLOPS
from .topk import TopKRow, row_topk, topk_cost, unpack


def selector(attention: AttentionMode, prompt: PromptAttention):
    """The causal attention's `select` hook for this chunk, or None when every query keeps every key."""
    context = prompt.start + prompt.tokens
    if attention.keys_kept(context) >= context:
        return None
    return lambda ctx, q, ks: select(ctx, q, ks, prompt, attention)


def select(ctx, q: np.ndarray, ks: np.ndarray, prompt: PromptAttention, attention: AttentionMode) -> Selection:
    """Predict, keep each row's top K, each query its own share (module doc): q (rows, cols, H, mb, db) in the C
    layout, ks (rows, cols, H, kb, db) skewed along y."""
    rows, cols, heads, mb, kb = q.shape[:4] + ks.shape[3:4]
    with ctx.ledger.at_rate(PREDICT_DTYPE):
        pred = scores_nt(ctx, q, log_keys(ks))  # (rows, cols, H, mb, kb): every query against every key
    pred = np.where(causal_mask(ctx, mb, prompt, kb)[:, :, None], pred, np.float32(-np.inf))
    i, j = held_blocks(ctx)  # (rows, 1), (rows, cols): the query block and key block of each core
    first = (j * kb)[:, :, None, None]  # (rows, cols, 1, 1): the first key position a core holds
    keep = attention.keys_kept(prompt.start + prompt.tokens)
    tops = row_topk(ctx, pred.reshape(rows, cols, heads * mb, kb), keep, first + np.arange(kb))
    pos = unpack(tops)[1].reshape(rows, cols, heads, mb, keep)  # every (head, query)'s K, best first
    query = prompt.start + (i * mb)[:, :, None, None, None] + np.arange(mb)[:, None]  # (rows, 1, 1, mb, 1)
    share = np.vectorize(lambda p: attention.keys_kept(int(p) + 1))(query)  # each query's own keys_kept
    return Selection(np.where(np.arange(keep) < share, pos, -1), min(kb, keep), kb)


def prefill_attention_parts(spec: HardwareSpec, shape: AttentionShape, attention: AttentionMode, moved: str,
                            rate: str) -> list[tuple[str, str, Cost]]:
    """(name, "attention", Cost) of a chunk's causal attention on the square (values moving as `moved`, the
    cores computing at `rate`'s): dense, or the prediction, the row's top-K (on every row of the square) and
    the attention over the kept keys."""
    context, side, heads = shape.context or shape.tokens, shape.side, shape.heads
    keep = attention.keys_kept(context)
    if keep >= context:
        return [("attention", "attention", attention_cost(spec, shape, ELEMENTWISE_FLOPS["softmax"], moved, rate))]
    mb, kb, db = cdiv(shape.tokens, side), shape.key_block, cdiv(shape.head_dim, side)
    predict = transposed_cost(spec, RingOperand(side, heads * mb * kb), RingOperand(side, heads * kb * db),
                              2 * heads * mb * db * kb, moved, PREDICT_DTYPE)
    top = topk_cost(spec, TopKRow(side, kb, heads * mb, keep))
    sparse = attention_cost(spec, replace(shape, kept=keep), ELEMENTWISE_FLOPS["softmax"], moved, rate)
    return ([("predict", "attention", predict)] + [(name, "attention", on_lines(c, side)) for name, c in top.items()]
            + [("attention", "attention", sparse)])
