"""The backward of a Llama block's element-wise ops and of the tied head, as kernels on a square grid's blocks.

Contract: every kernel runs over a square region of s x s living cores (as ``causal_attention``) on blocks in
the layouts of waferrt.kernels.gemm_backward: a (T, n) activation in the *C layout* is (rows, cols, T/s, n/s)
(tokens over the rows, features over the columns; a per-head one (rows, cols, H, T/s, head_dim/s)), a
matrix in the *A* or *B layout* as a MeshGEMM takes it. Padding (tokens or features beyond the real ones)
holds zeros and gets zero gradients.

- ``rmsnorm_backward(ctx, x, w, dh, res, norm)`` -> (dx, dw): y = x / rms(x) * w; the two per-token sums
  (sum x^2, sum dh w x) are allreduces along the rows, the weight's gradient (a sum over the tokens) an
  allreduce down the columns -- reduced over the fabric. `res` (the residual's gradient) is added to dx.
- ``swiglu_backward(ctx, gate, up, dm)`` -> (dgate, dup) of m = silu(gate) * up: in each core.
- ``rope_backward(ctx, d, cos, sin)``: the rotation by minus the angle, in each core (a core's head_dim
  block must hold whole pairs: head_dim / s rounded up even).
- ``relayout(ctx, buf, src, dst)``: a block's layout changed on the mesh, A <-> C by MeshGEMM's skew along
  the rows, B <-> C along the columns (``skew``, booked as ``skew_cost``).
- ``head_backward(ctx, h, e, onehot, vocab)`` -> (loss, dh, de): the tied head's logits h E^T (the
  transposed MeshGEMM, E in the B layout), the mean softmax cross-entropy against `onehot` (the targets,
  A layout), dh = dlogits E (MeshGEMM) and dE = dlogits^T h (transposed): E never moves but as a GEMM's
  operand, and both its gradients land where it is.
- ``head_stats(ctx, h, e, onehot, run, vocab)`` -> run, ``head_grads(ctx, h, e, onehot, run, vocab)`` -> (dh,
  de), ``head_loss(ctx, run, vocab)`` -> loss: the same head cut in chunks of the vocabulary (E's chunk in the
  B layout, its targets' one-hot columns in the A layout): ``head_stats`` folds a chunk's logits into the online
  softmax's running (max, sum of exp, target's logit) per token (rows, cols, 3, mb); once every chunk is
  folded, ``head_grads`` recomputes a chunk's logits and gives its share of dh and its whole dE, and
  ``head_loss`` the mean loss -- exact, as the unchunked kernel's.
- ``embedding_backward(ctx, onehot, dx)`` -> dE: the scatter-add of the tokens' gradients into their
  embedding rows, as the transposed product onehot^T dX (each core's one-hot block from the token ids).

What each books: waferrt.core.train_cost (``rmsnorm_backward_cost`` & co, tests/unit/test_train_kernels.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from waferrt.core.train_cost import BACKWARD_FLOPS

from .attention import ring_index, skew, square_places
from .gemm import Grid, meshgemm
from .gemm_backward import accumulate


def booked(kernel):
    """The kernel's cost booked under its own name (e.g. "rmsnorm_backward")."""
    @functools.wraps(kernel)
    def run(ctx, *args, **kwargs):
        with ctx.ledger.op(kernel.__name__):
            return kernel(ctx, *args, **kwargs)
    return run


@dataclass(frozen=True)
class Norm:
    """An RMSNorm's width (the real features, without padding) and epsilon."""

    dim: int
    eps: float

    def __post_init__(self) -> None:
        if self.dim < 1 or self.eps <= 0:
            raise ValueError(f"an RMSNorm over {self.dim} features with eps {self.eps}: give dim >= 1, eps > 0")


@dataclass(frozen=True)
class HeadShape:
    """The tied head's real vocabulary and tokens (the blocks' rest is padding)."""

    size: int
    tokens: int

    def __post_init__(self) -> None:
        if self.size < 1 or self.tokens < 1:
            raise ValueError(f"a head over {self.size} words and {self.tokens} tokens: give both >= 1")


@booked
def rmsnorm_backward(ctx, x, w, dh, res, norm: Norm):
    """(dx, dw) of y = x / sqrt(mean(x^2) + eps) * w (module doc): x, dh, res (rows, cols, mb, nb), w
    (rows, cols, 1, nb) -> dx like x, dw like w."""
    r = 1 / np.sqrt(ctx.allreduce((x * x).sum(-1), "x") / np.float32(norm.dim) + np.float32(norm.eps))  # (.., mb)
    g = dh * w
    gx = ctx.allreduce((g * x).sum(-1), "x")  # (rows, cols, mb)
    dx = res + r[..., None] * g - x * (r ** 3 * gx / np.float32(norm.dim))[..., None]
    dw = ctx.allreduce((dh * x * r[..., None]).sum(-2, keepdims=True), "y")  # the tokens' sum, down the columns
    ctx.ledger.compute(BACKWARD_FLOPS["rmsnorm"] * x.shape[-2] * x.shape[-1])
    return dx.astype(np.float32), dw.astype(np.float32)


@booked
def swiglu_backward(ctx, gate, up, dm):
    """(dgate, dup) of m = silu(gate) * up, every block (rows, cols, mb, nb)."""
    sig = 1 / (1 + np.exp(-gate))
    ctx.ledger.compute(BACKWARD_FLOPS["swiglu"] * gate.shape[-2] * gate.shape[-1])
    return dm * up * sig * (1 + gate * (1 - sig)), dm * gate * sig


@booked
def rope_backward(ctx, d, cos, sin):
    """The gradient before RoPE from `d` after it: d (rows, cols, H, mb, db), cos and sin (rows, cols, mb,
    db) each pair's angle repeated on both its features (rotating adjacent pairs by minus the angle)."""
    ctx.ledger.compute(BACKWARD_FLOPS["rope"] * d.size // (d.shape[0] * d.shape[1]))
    return rotate_pairs(d, cos, -sin)


def rotate_pairs(d, cos, sin):
    """RoPE in each core, unbooked: d (rows, cols, H, mb, db)'s adjacent feature pairs rotated by the angles
    of cos and sin (rows, cols, mb, db), each pair's repeated on both its features (minus sin: the inverse)."""
    if d.shape[-1] % 2:
        raise ValueError(f"a core's head_dim block of {d.shape[-1]} features splits a RoPE pair: give a grid "
                         "whose side leaves an even ceil(head_dim / side)")
    pairs = d.reshape(*d.shape[:-1], -1, 2)  # (.., db/2, 2)
    c, s = cos[:, :, None, :, ::2], sin[:, :, None, :, ::2]
    out = np.empty_like(pairs)
    out[..., 0] = pairs[..., 0] * c - pairs[..., 1] * s
    out[..., 1] = pairs[..., 1] * c + pairs[..., 0] * s
    return out.reshape(d.shape)


MOVES = {("C", "A"): ("x", False), ("A", "C"): ("x", True), ("C", "B"): ("y", False), ("B", "C"): ("y", True)}


@booked
def relayout(ctx, buf, src: str, dst: str):
    """`buf`'s blocks from layout `src` into `dst` (module doc)."""
    if (src, dst) not in MOVES:
        raise ValueError(f"no layout move {src} -> {dst}; the moves are {sorted(MOVES)}")
    return skew(ctx, buf, *MOVES[src, dst])


def _columns(ctx, mb: int, vb: int, vocab: HeadShape) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols, mb, vb) bools of each core's A-layout block (i, (i + c) % s) of mb tokens by vb words: a
    real word's column, a real token's row."""
    xs, ys = square_places(ctx)
    s = len(xs)
    i = ring_index(ys, ctx.local.y0 - ctx.region.y0, ctx.local.h)[:, None]
    j = (i + ring_index(xs, ctx.local.x0 - ctx.region.x0, ctx.local.w)[None, :]) % s
    word = (j * vb)[..., None, None] + np.arange(vb) < vocab.size  # (rows, cols, 1, vb)
    token = ((i * mb)[..., None] + np.arange(mb) < vocab.tokens)[..., None]  # (rows, 1, mb, 1)
    return np.broadcast_to(word, j.shape + (mb, vb)), np.broadcast_to(token, j.shape + (mb, vb))


@booked
def head_backward(ctx, h, e, onehot, vocab: HeadShape):
    """(loss (rows, cols, 1), dh, de) of the tied head with mean cross-entropy (module doc): h (rows, cols,
    mb, nb) C layout, e (rows, cols, vb, nb) B layout, onehot (rows, cols, mb, vb) A layout."""
    grid = Grid.of_ctx(ctx)
    logits = accumulate(ctx, grid, h, e, "nt")  # (rows, cols, mb, vb), A layout
    word, token = _columns(ctx, *logits.shape[-2:], vocab)
    logits = np.where(word, logits, np.float32(-np.inf))
    top = ctx.allreduce(logits.max(-1), "x", op="max")  # (rows, cols, mb)
    ex = np.where(word, np.exp(logits - top[..., None]), np.float32(0))
    total = ctx.allreduce(ex.sum(-1), "x")
    picked = ctx.allreduce((np.where(word, logits, 0) * onehot).sum(-1), "x")  # the target's logit
    lse = top + np.log(total)
    rows_loss = np.where(token[..., 0], lse - picked, np.float32(0)).sum(-1, keepdims=True)  # (rows, cols, 1)
    loss = ctx.allreduce(rows_loss, "y") / np.float32(vocab.tokens)
    dlogits = np.where(token, ex / total[..., None] - onehot, np.float32(0)) / np.float32(vocab.tokens)
    ctx.ledger.compute(BACKWARD_FLOPS["cross_entropy"] * logits.shape[-2] * logits.shape[-1])
    dh = meshgemm(ctx, dlogits[:, :, None].astype(np.float32), e[:, :, None])  # C layout
    de = accumulate(ctx, grid, h, dlogits.astype(np.float32), "tn")  # B layout
    return loss.astype(np.float32), dh, de


@booked
def head_stats(ctx, h, e, onehot, run, vocab: HeadShape):
    """`run` (rows, cols, 3, mb): (max, sum of exp, target's logit) per token, with this chunk's words folded
    in: h (rows, cols, mb, nb) C layout, e (rows, cols, vb, nb) B layout, onehot (rows, cols, mb, vb) A."""
    logits = accumulate(ctx, Grid.of_ctx(ctx), h, e, "nt")  # (rows, cols, mb, vb), A layout
    word, _ = _columns(ctx, *logits.shape[-2:], vocab)
    logits = np.where(word, logits, np.float32(-np.inf))
    top = np.maximum(run[:, :, 0], ctx.allreduce(logits.max(-1), "x", op="max"))  # (rows, cols, mb)
    ex = np.where(word, np.exp(logits - top[..., None]), np.float32(0))
    total = run[:, :, 1] * np.exp(run[:, :, 0] - top) + ctx.allreduce(ex.sum(-1), "x")
    picked = run[:, :, 2] + ctx.allreduce((np.where(word, logits, 0) * onehot).sum(-1), "x")
    ctx.ledger.compute(BACKWARD_FLOPS["cross_entropy"] * logits.shape[-2] * logits.shape[-1])
    return np.stack([top, total, picked], 2).astype(np.float32)


@booked
def head_grads(ctx, h, e, onehot, run, vocab: HeadShape):
    """(dh, de): this chunk's share of dh (C layout) and its rows of dE (B layout), from the folded `run`."""
    grid = Grid.of_ctx(ctx)
    logits = accumulate(ctx, grid, h, e, "nt")
    word, token = _columns(ctx, *logits.shape[-2:], vocab)
    lse = run[:, :, 0] + np.log(run[:, :, 1])  # (rows, cols, mb)
    p = np.where(word, np.exp(logits - lse[..., None]), np.float32(0))
    dlogits = (np.where(token, p - onehot, np.float32(0)) / np.float32(vocab.tokens)).astype(np.float32)
    ctx.ledger.compute(BACKWARD_FLOPS["cross_entropy"] * logits.shape[-2] * logits.shape[-1])
    return meshgemm(ctx, dlogits[:, :, None], e[:, :, None]), accumulate(ctx, grid, h, dlogits, "tn")


@booked
def head_loss(ctx, run, vocab: HeadShape):
    """The mean loss (rows, cols, 1) from the folded `run` (rows, cols, 3, mb): summed down the columns."""
    _, token = _columns(ctx, run.shape[-1], 1, HeadShape(1, vocab.tokens))
    rows_loss = np.where(token[..., 0], run[:, :, 0] + np.log(run[:, :, 1]) - run[:, :, 2], np.float32(0))
    return (ctx.allreduce(rows_loss.sum(-1, keepdims=True), "y") / np.float32(vocab.tokens)).astype(np.float32)


@booked
def embedding_backward(ctx, onehot, dx):
    """dE = onehot^T dX: onehot (rows, cols, mb, vb) A layout, dx (rows, cols, mb, nb) C layout -> B layout."""
    return accumulate(ctx, Grid.of_ctx(ctx), dx, onehot, "tn")
