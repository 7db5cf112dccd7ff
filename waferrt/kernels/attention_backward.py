"""The backward of causal attention over a prompt (with GQA) as mesh kernels, laid out as the forward's.

Contract: ``attention_backward(net, q, k, v, do, prompt)`` is a kernel over a square grid of s x s living
cores (the whole region, as ``causal_attention``, on the kernel's Net: decode.kernel_net.KernelNet over
``net.ctx``): q and do are the H query heads' (T, head_dim) matrices, k and v the G K/V heads', all in the C
layout as (rows, cols, heads, T/s, head_dim/s) blocks (query head h reads K/V head h // (H / G)). It returns
(dQ in the C layout, dK and dV in the *B layout*: core at ring place (i, j) holds the block of key block
(i + j) % s, head_dim block j -- where the forward's skew put K and V), stacked as (rows, cols, 3, H, ...) with
dK, dV in the first G heads (the rest zero).

The steps, every block moving hop by hop on MeshGEMM's rings (waferrt.kernels.gemm, gemm_backward):
K and V repeated to the query heads (a copy in each core) and skewed as the forward does; P recomputed
(``probabilities``: Q.K^T by the transposed MeshGEMM, the forward's softmax on the Net) -- recomputed rather than kept,
because P is T x T per head (T a sequence's tokens), T/head_dim times what Q, K and V hold, and its
recomputation costs one transposed pass, the forward's; dP = dO V^T (transposed, "nt", in P's A layout);
the softmax's backward dS = scale P (dP - rowsum(P dP)) (one allreduce along the rows); dQ = dS K by
MeshGEMM (as P.V);
dK = dS^T Q and dV = P^T dO by the transposed variant "tn" (the queries summed as the accumulators pass
down the columns); each K/V head's gradient summed over its query heads in the core. Booked under
"attention_backward"; ``waferrt.core.train_cost.attention_backward_cost`` is what that comes to
(tests/unit/test_train_kernels.py).
"""

from __future__ import annotations

import numpy as np

from waferrt.core.train_cost import BACKWARD_FLOPS

from .attention import PromptAttention, probabilities, skew
from .gemm import Grid, meshgemm
from .gemm_backward import accumulate
from .sequences import fold, unfold


def _grouped(buf: np.ndarray, kv_heads: int, sequences: int) -> np.ndarray:
    """(rows, cols, B*H, sb, ...) folded -> the sum over each K/V head's query heads, unfolded and padded back
    to H heads with zeros: (rows, cols, H, B*sb, ...)."""
    rows, cols, heads = buf.shape[:3]
    sums = unfold(buf.reshape(rows, cols, kv_heads, heads // kv_heads, *buf.shape[3:]).sum(axis=3), sequences)
    out = np.zeros((rows, cols, heads // sequences) + sums.shape[3:], buf.dtype)
    out[:, :, :sums.shape[2]] = sums
    return out


def attention_backward(net, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                       prompt: PromptAttention) -> np.ndarray:
    """dQ, dK, dV of the heads' causal attention (module doc): (rows, cols, 3, H, T/s, head_dim/s); with
    prompt.sequences side by side in each block, each on its own, as that many times the heads (sequences.fold)."""
    ctx, B = net.ctx, prompt.sequences
    q, k, v, do = (fold(a, B) for a in (q, k, v, do))
    heads, kv_heads, mb, db = q.shape[2], k.shape[2], q.shape[3], q.shape[4]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} K/V heads evenly: give n_heads a "
                         "multiple of n_kv_heads")
    rep = heads // kv_heads
    grid = Grid.of_ctx(ctx)
    with ctx.ledger.op("attention_backward"):
        ks, vs = (skew(ctx, np.repeat(a, rep, axis=2), "y") for a in (k, v))
        p = probabilities(net, q, ks, prompt)  # (rows, cols, H, mb, mb), A layout
        dp = accumulate(ctx, grid, do, vs, "nt")  # dO V^T, A layout
        row = ctx.allreduce((p * dp).sum(axis=4), "x")  # (rows, cols, H, mb)
        ds = p * (dp - row[..., None]) * np.float32(prompt.scale)
        ctx.ledger.compute(BACKWARD_FLOPS["softmax"] * heads * mb * mb)
        dq = meshgemm(ctx, ds[:, :, None], ks[:, :, None])  # C layout
        dk = accumulate(ctx, grid, q, ds, "tn")  # dS^T Q, B layout
        dv = accumulate(ctx, grid, do, p, "tn")  # P^T dO, B layout
        ctx.ledger.compute(2 * (rep - 1) * kv_heads * mb * db)  # the query heads' sums, K's and V's
        return np.stack([unfold(dq, B), _grouped(dk, kv_heads, B), _grouped(dv, kv_heads, B)], axis=2)
