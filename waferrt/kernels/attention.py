"""Causal attention over a prompt as mesh GEMMs: the transposed MeshGEMM for Q.K^T, then MeshGEMM for P.V.

Contract: ``causal_attention(net, q, k, v, prompt=PromptAttention(T, scale))`` is a kernel over a square grid of
s x s cores (the whole region), run through the kernel's Net (``net``: decode.kernel_net.KernelNet over the
kernel's Context ``net.ctx``; kernels cannot import the decode, so it is taken, not made, here): q, k, v are
H heads' (T, head_dim) matrices in the *C layout* of waferrt.kernels.gemm (block (i, c) of T/s tokens by
head_dim/s on the core at ring place (i, c): how a MeshGEMM leaves its product, e.g. the QKV projection), as (rows,
cols, H, T/s, head_dim/s)
blocks -- every head's blocks move together; it returns the heads' outputs in the same layout. Row i of
the scores is token block i attending to every token block j <= i (masked causally, and beyond the T
tokens).

Q.K^T is the *transposed* MeshGEMM: K is never transposed across the mesh. Each column c of K is first
rotated by c places along its ring (``skew``: c ring moves, every move at most two hops), so core (i, c)
holds K((i + c) % s, c); Q stays put; at every step each core adds Q(i, c) K^T to the score block it
carries, then the score blocks move one place along the rows' rings and K's blocks one place along the
columns'. The score block of (i, j) thereby visits every column of row i, and after s steps core (i, c)
holds S(i, (i + c) % s): the A layout that MeshGEMM takes, so the softmax (a row max and a row sum, each an
allreduce along x) and P.V (V skewed like K, then ``meshgemm``) follow with no other move. Booked under
"attention"; ``waferrt.core.gemm_cost.attention_cost`` is what that comes to. Under sparse attention (`select`)
the score and P blocks are *compact*, a query's kept keys of the block alone (kernels.sparse_attention.KeptKeys):
only those are computed, and only those move.

:func:`softmax` is the attention's softmax, written once for every path: the decode's (decode.shards,
``LayerShard._dense`` on FastNet / HopNet), the prefill's and training's (here, on the KernelNet), and the
backward's recomputed P (kernels.attention_backward). It reaches across cores only through its Net's
``reduce`` (the row's max and sum over a split axis) and records its flops through ``elementwise``, so each
Net's collectives and records are its own and the math is one. (STAR's sparse attention instead merges the
cores' sorted-updating online softmax, kernels.sparse_attention.flash / ``row_statistics``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemm import Grid, meshgemm, places, ring_move, used_lines
from .gemm_backward import accumulate
from .sequences import fold, unfold
from .sparse_attention import KeptKeys, Selection, row_statistics


def square_places(ctx) -> tuple[list[int], list[int]]:
    grid = Grid.of_ctx(ctx)
    if len(grid.cols) != ctx.region.w or len(grid.rows) != ctx.region.h or ctx.region.w != ctx.region.h:
        raise ValueError(f"causal_attention runs on a square region of living cores; {ctx.region} is "
                         f"{ctx.region.w}x{ctx.region.h} with {len(ctx.dead_cores)} dead core(s): give it a "
                         "square region without them")
    return places("meshgemm", grid)


def ring_index(places_: list[int], lo: int, m: int) -> np.ndarray:
    """The ring index of each of this tile's m positions from `lo` along a line."""
    at = {p: r for r, p in enumerate(places_)}
    return np.array([at[lo + j] for j in range(m)])


def skew(ctx, buf: np.ndarray, axis: str, back: bool = False) -> np.ndarray:
    """Rotate every line along `axis` by its own ring index (along "y": column c moves c places along its
    ring, so core (i, c) then holds what core (i + c, c) held): s - 1 rounds of ring moves, the lines still
    to move moving. `back`: by s minus its ring index, which undoes the skew (the same moves' count)."""
    xs, ys = square_places(ctx)
    along, across = (xs, ys) if axis == "x" else (ys, xs)
    s = len(along)
    lo, m = (ctx.local.y0 - ctx.region.y0, ctx.local.h) if axis == "x" else (ctx.local.x0 - ctx.region.x0,
                                                                             ctx.local.w)
    places_of = (lambda i: (s - i) % s) if back else (lambda i: i)  # noqa: E731
    mine = places_of(ring_index(across, lo, m))  # how far each of this tile's lines moves
    shape = (m, 1) if axis == "x" else (1, m)
    for r in range(1, s):
        moving = [p for i, p in enumerate(across) if places_of(i) >= r]
        with ctx.ledger.concurrent():
            moved = ring_move(ctx, buf, axis, along, used_lines(ctx, moving, axis))
        keep = (mine >= r).reshape(shape + (1,) * (buf.ndim - 2))
        buf = np.where(keep, moved, buf)
    return buf


def scores_nt(ctx, q: np.ndarray, k: np.ndarray, kept: KeptKeys | None = None) -> np.ndarray:
    """S = Q K^T by the transposed MeshGEMM (module doc): q (rows, cols, H, mb, db), k (.., kb, db) in the C
    layout, K already skewed along y; returns S's (H, mb, kb) blocks in the A layout. `kept` (sparse
    attention, kernels.sparse_attention.KeptKeys): only each query's kept keys are multiplied, and S comes
    compact, (H, mb, kept) a block."""
    return accumulate(ctx, Grid.of_ctx(ctx), q, k, "nt", kept)


def kept_keys(ctx, chosen: Selection) -> KeptKeys:
    """The step products over `chosen`'s keys on this square: the key block each core's A-layout block is."""
    return KeptKeys(chosen, held_blocks(ctx)[1], len(square_places(ctx)[0]))


@dataclass(frozen=True)
class PromptAttention:
    """What the causal attention over a prompt needs besides its blocks: the prompt's `tokens` (the rest of
    the blocks is padding), the score `scale` (1/sqrt(head_dim)), the
    `sequences` side by side in each core's blocks (waferrt.kernels.sequences' layout, `tokens` each: each runs
    on its own, batched with the heads); and the positions before the queries' (`start`: a chunk of a longer
    prompt, whose keys and values are the start + tokens positions of its context)."""

    tokens: int
    scale: float
    sequences: int = 1
    start: int = 0

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.scale <= 0 or self.sequences < 1 or self.start < 0:
            raise ValueError(f"causal attention over {self.sequences} sequence(s) of {self.tokens} tokens from "
                             f"position {self.start} with scale {self.scale}: give at least one sequence of one "
                             "token, a start >= 0 and a positive scale")


def held_blocks(ctx) -> tuple[np.ndarray, np.ndarray]:
    """(i (rows, 1), j (rows, cols)): the query block and the key block of each core's A-layout score block
    (i, (i + c) % s), i and c its ring places."""
    xs, ys = square_places(ctx)
    i = ring_index(ys, ctx.local.y0 - ctx.region.y0, ctx.local.h)[:, None]
    c = ring_index(xs, ctx.local.x0 - ctx.region.x0, ctx.local.w)[None, :]
    return i, (i + c) % len(xs)


def causal_mask(ctx, mb: int, prompt: PromptAttention, key_block: int | None = None) -> np.ndarray:
    """(rows, cols, mb, key_block) bool: which score entries of each core's A-layout block (i, (i + c) % s) a
    query may attend to: the key at or before the query (queries are positions prompt.start.., mb a block;
    keys 0.., key_block a block, default mb), a real token (before start + tokens)."""
    kb = key_block or mb
    i, j = held_blocks(ctx)
    query = prompt.start + (i * mb)[..., None, None] + np.arange(mb)[:, None]
    key = (j * kb)[..., None, None] + np.arange(kb)[None, :]
    return (key <= query) & (key < prompt.start + prompt.tokens)


def softmax(net, comm, scores: np.ndarray, hidden: np.ndarray, positions: int = 0) -> np.ndarray:
    """Each row's softmax over the last axis of `scores` (..., n), that axis split over `comm`'s line of `net`'s
    cores: the entries where `hidden` (broadcasting to scores) is set get probability 0, a row that sees no
    entry (a padding query) all 0. The row's max and sum are the Net's ``reduce`` along the line, the
    element-wise work its ``elementwise`` ("softmax"; `positions`: the last axis is a K/V positions axis of
    which the fullest core holds that many). `scores` is overwritten; the probabilities are returned."""
    np.copyto(scores, np.float32(-np.inf), where=hidden)
    top = net.reduce(comm, scores, "max")
    scores -= np.where(np.isfinite(top), top, np.float32(0))  # a row with no entry stays at -inf: exp gives 0
    e = np.exp(scores, out=scores)
    total = net.reduce(comm, e, "sum", positions=bool(positions))
    net.elementwise(comm, "softmax", e, positions)
    e /= np.where(total > 0, total, np.float32(1))
    return e


def probabilities(net, q: np.ndarray, k: np.ndarray, prompt: PromptAttention, kept: KeptKeys | None = None
                  ) -> np.ndarray:
    """The heads' causal softmax(scale Q K^T) in the A layout, (rows, cols, H, mb, kb): q in the C layout, k
    (its kb positions a block) already skewed along y (module doc); masked entries and padding queries get 0.
    `kept` (sparse attention): over each query's kept keys alone, compact (rows, cols, H, mb, kept)
    (``sorted_probabilities``)."""
    ctx, mb, kb = net.ctx, q.shape[3], k.shape[3]
    scores = scores_nt(ctx, q, k, kept) * np.float32(prompt.scale)
    valid = causal_mask(ctx, mb, prompt, kb)[:, :, None]  # (rows, cols, 1, mb, kb)
    if kept is not None:
        places, inside = kept.at(0)  # the A-layout block's kept keys, in predicted order
        return sorted_probabilities(net, scores, inside & np.take_along_axis(valid, places, -1))
    return softmax(net, None, scores, ~valid)


def sorted_probabilities(net, scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Sparse attention's P over the kept keys, compact (rows, cols, H, mb, kept) scores in predicted order
    (`valid`: a kept key the query may see): each core's online softmax over them (``net.flash``:
    kernels.sparse_attention.flash, STAR's sorted-updating FlashAttention), the cores' Partials merged over
    the row (kernels.sparse_attention.row_statistics), then each kept key's probability, 0 where not valid."""
    part = net.flash(None, scores, valid)
    top, total, _ = row_statistics(net, None, part)
    e = np.where(valid, np.exp(scores - top), np.float32(0))
    net.elementwise(None, "softmax", e)
    return e / np.where(total > 0, total, np.float32(1))


def causal_attention(net, q: np.ndarray, k: np.ndarray, v: np.ndarray, prompt: PromptAttention,
                     select=None) -> np.ndarray:
    """The heads' causal attention over the prompt (module doc) on `net` (the kernel's KernelNet): q (rows, cols,
    H, mb, db) blocks in, and out;
    k and v (rows, cols, H, kb, db): the blocks of the prompt.start + prompt.tokens positions of its context;
    prompt.sequences of them side by side in each block, run as that many times the heads (sequences.fold).
    `select` (sparse attention, e.g. waferrt.decode.sparse_prefill): select(ctx, q, k skewed) -> the
    Selection of keys each query attends to, over which the softmax and P.V then run."""
    ctx, (q, k, v) = net.ctx, (fold(a, prompt.sequences) for a in (q, k, v))
    with ctx.ledger.op("attention"):
        ks = skew(ctx, k, "y")
        kept = kept_keys(ctx, select(ctx, q, ks)) if select is not None else None
        p = probabilities(net, q, ks, prompt, kept)
        out = meshgemm(ctx, p[:, :, None], skew(ctx, v, "y")[:, :, None], kept)
        return unfold(out, prompt.sequences)
