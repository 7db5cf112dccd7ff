"""One decoder layer and the embedding/head, run by the cores of their regions (MeshGEMV decode).

Contract: a :class:`LayerShard` holds one layer's weight blocks (waferrt.decode.pack) and the K/V caches
of its requests (:class:`~waferrt.decode.kvcache.MeshKVCache`) in the cores of its region, and runs a
micro-batch of tokens through the layer with :meth:`LayerShard.forward`. Every data movement between
cores is a collective of waferrt.fabric.comm (booked in the ledger); the math per core is local and uses
the reference's ops (waferrt.model.reference: RoPE on adjacent pairs, SiLU), booked as flops: the block
GEMVs and attention products by their multiply-adds, the element-wise work (RMSNorm, RoPE, softmax, SiLU,
residual adds) at waferrt.decode.cost.ELEMENTWISE_FLOPS per element. The residual stream enters
and leaves as x (B, cols, dim_c): split over the region's columns, replicated down its rows (one copy
kept). :class:`EmbedShard` holds the tied embedding table: it looks a token's row up and, with the final
norm, computes the logits.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import numpy as np

from waferrt.core.dtypes import to_f32
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.fabric.comm import KTREE_FAST, Collectives, LineComm, Slices, Span
from waferrt.model.config import LlamaConfig
from waferrt.model.reference import silu

from . import sparse
from .cost import ELEMENTWISE_FLOPS as EW
from .cost import Decoding
from .kvcache import FlowKVCache, MeshKVCache, as_slice
from .pack import Chunks, rope_tables
from .topk import TopKRow


def mesh_rmsnorm(comm: LineComm, x: np.ndarray, w: np.ndarray, config: LlamaConfig, coll: Collectives) -> np.ndarray:
    """RMSNorm of x (B, C, dim_c), split over the columns of `comm`'s line: the sum of squares is a row
    allreduce (every row does the same one: one copy is kept)."""
    if comm.fast:  # the sum at once, the allreduce of one value per item booked
        ss = np.einsum("bcd,bcd->b", x, x)  # (B,)
        book_allreduce(comm, coll, x.shape[0], replicated=True)
    else:
        ss = comm.allreduce((x * x).sum(axis=2), coll, slices=Slices(1, replicated=True),
                            collapse=True)  # (B,)
    comm.ledger.compute(EW["rmsnorm"] * x.shape[0] * x.shape[2])
    scale = np.float32(1.0) / np.sqrt(ss / np.float32(config.dim) + np.float32(config.norm_eps))
    out = x * scale[:, None, None]
    out *= w
    return out


PANEL_ROWS = 64  # the most output rows per BLAS call: a few tokens times a narrow panel of a matrix runs
# 1.5-2x faster than times the whole matrix at once (OpenBLAS packs less; benchmarks/profile_decode.py)


@functools.cache
def _panel(rows: int) -> int:
    """The widest panel of at most PANEL_ROWS rows that cuts `rows` evenly."""
    return max(n for n in range(1, min(rows, PANEL_ROWS) + 1) if rows % n == 0)


@functools.lru_cache(maxsize=8)
def _rope_table(config: LlamaConfig, rows: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (positions, rows, 1, hd_r/2) float32 of every position up to `positions` for a region of
    `rows` rows (waferrt.decode.pack.rope_tables' pairs), the angles computed in float64 and rounded once."""
    inv_freq, _ = rope_tables(config, rows)  # (R, hd_r/2)
    ang = np.arange(positions, dtype=np.float64)[:, None, None] * inv_freq[None]  # (P, R, hd_r/2)
    return np.cos(ang).astype(np.float32)[:, :, None], np.sin(ang).astype(np.float32)[:, :, None]


def matmul_rows(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x (B, in) times w (out, in) transposed -> (B, out), as one batched BLAS call over panels of w's rows
    (one GEMV for a single token). The sums are each output's dot product, whatever the panels."""
    if len(x) == 1:
        return (w @ x[0])[None]
    n = _panel(w.shape[0])
    return np.matmul(w.reshape(-1, n, w.shape[1]), x.T).reshape(w.shape[0], len(x)).T  # (out/n, n, B) -> (B, out)


def book_allreduce(comm: LineComm, coll: Collectives, values: int, replicated: bool = False) -> None:
    """Book an allreduce of `values` float32 values per core along `comm`'s lines, computed another way
    (the fast path)."""
    if comm.ledger.quiet:  # replaying a layer's bookings (LayerShard.run)
        return
    with comm.ledger.op(f"allreduce.{coll.algo}"):
        comm.book_allreduce(coll.algo, coll.k, values, replicated)


def mesh_gemv(comm: LineComm, coll: Collectives, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """MeshGEMV: x (B, P, i) is split over the P cores of each of `comm`'s lines; w (Q*o, P*i) holds every
    core's block (waferrt.decode.pack: line q's outputs, its P cores' inputs side by side). Every core
    multiplies its block, then the partial sums are allreduced along the line -> (B, Q, o). The fast path
    sums as one matmul over the joined input (the same blocks, each read once) and books the allreduce's
    messages."""
    B, P, i = x.shape
    Q = comm.lines
    comm.ledger.compute(2 * B * i * w.shape[0] // Q)  # the busiest core's block GEMV, for every item
    if comm.fast:
        book_allreduce(comm, coll, B * w.shape[0])
        return matmul_rows(w, x.reshape(B, P * i)).reshape(B, Q, -1)
    per_core = w.reshape(-1, P, i).transpose(1, 2, 0)  # (P, i, Q*o): each core's blocks, every line's
    part = np.matmul(x.transpose(1, 0, 2), per_core).reshape(P, B, Q, -1)  # every core's block GEMV, all items
    return comm.allreduce(part, coll, collapse=True, overwrite=True)


@dataclass(frozen=True, eq=False)
class Items:
    """A micro-batch's items as every layer of a segment sees them, worked out once (not once per layer):
    item b is the token at position poss[b] of the request in slots[b]; attention reads `length` positions,
    `rows` are the slots as a slice when evenly spaced (a lane's: the caches are read as a view), `hidden`
    (B, 1, 1, length) the positions after each item's own; the RoPE angles kept per row count."""

    slots: np.ndarray  # (B,) int
    poss: np.ndarray  # (B,) int
    length: int
    rows: slice | np.ndarray
    hidden: np.ndarray
    angles: dict = field(default_factory=dict, repr=False)  # rows of a region -> (cos, sin) of its table

    def __post_init__(self) -> None:
        if self.slots.shape != self.poss.shape or self.slots.ndim != 1:
            raise ValueError(f"Items: slots {self.slots.shape} and positions {self.poss.shape} are one per item")

    @classmethod
    def of(cls, slots: np.ndarray, poss: np.ndarray) -> Items:
        length = int(poss.max()) + 1 if len(poss) else 0
        return cls(slots, poss, length, as_slice(slots), (np.arange(length)[None] > poss[:, None])[:, None, None])

    def rope(self, shard: LayerShard) -> tuple[np.ndarray, np.ndarray]:
        """(cos, cos) and (-sin, sin) pair by pair (B, R, 1, hd_r) of the items' positions for `shard`'s rows
        (LayerShard._rope; what `rotate` takes), worked out once per row count."""
        if shard.rows not in self.angles:
            cos, sin = shard._rope(self.poss)  # (B, R, 1, hd_r/2)
            self.angles[shard.rows] = (np.repeat(cos, 2, axis=-1),
                                       np.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], -1))
        return self.angles[shard.rows]


def rotate(x: np.ndarray, cos2: np.ndarray, sin2: np.ndarray) -> np.ndarray:
    """reference.apply_rope in three operations, bit for bit: x (..., hd) with (cos, cos) and (-sin, sin)
    pair by pair (Items.rope). Pair (a, b) -> (a cos + b (-sin), b cos + a sin) = (a cos - b sin, a sin + b cos)
    (negation is exact, a sum is the same either way round)."""
    swapped = x.reshape(*x.shape[:-1], -1, 2)[..., ::-1].reshape(x.shape)  # (b, a) of every pair
    out = x * cos2
    out += swapped * sin2
    return out


def in_float32(arrays: dict, name: str, dtype: str) -> np.ndarray:
    """Block `name` of `arrays` in float32, the form the host computes with. On its first use a storage-dtype
    block is widened (exactly) and put in its place in `arrays`: the host holds each block once, in float32,
    from then on, and a decode step reads it as it is (it was converted for every micro-batch). A block put
    back at the storage dtype (a streamed layer's next blocks) is widened again on its use."""
    a = arrays[name]
    if a.dtype != np.float32:
        a = arrays[name] = to_f32(a, dtype)
    return a


class LayerShard:
    def __init__(self, dec: Decoding, region: Region, arrays: dict, kv: tuple[int, int], ledger: Ledger):
        """`dec`: the model, the storage dtype, the collectives; `arrays` from pack_layer; `kv` = (requests,
        positions per request) of the K/V caches."""
        config, coll, dtype = dec.config, dec.coll, dec.dtype
        self.config, self.region, self.ledger, self.coll = config, region, ledger, coll
        self.arrays, self.dtype = arrays, dtype  # weights and K/V are stored in `dtype`, computed in float32
        # (the cores hold the blocks in `dtype`, what SRAM books; the host widens them once: in_float32)
        self.rows, self.cols = region.h, region.w
        self.cx = LineComm("x", Span.of(region), ledger, fast=coll.fast)
        self.cy = LineComm("y", Span.of(region), ledger, fast=coll.fast)
        self.hd_r = arrays["wqkv"].shape[0] // (self.rows * (config.n_heads + 2 * config.n_kv_heads))
        cache = FlowKVCache if coll.fast else MeshKVCache  # the same entries, counts and bookings
        self.kv = cache(config, self.cx, kv[0], kv[1], self.hd_r, dtype)
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))
        self.attention = dec.attention  # dense, or sparse:K (waferrt.decode.sparse)
        self._booked: dict[tuple, list] = {}  # (items[, entries held]) -> what that part of run books

    def _rope(self, poss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (B, R, 1, hd_r/2) float32 of the items' positions: rows of the table every layer of this
        row count shares, angles in float64 like the reference's."""
        table = _rope_table(self.config, self.rows, self.kv.cap * self.cols)
        if int(poss.max()) >= len(table[0]):  # beyond the cache (its insert refuses it): at once, as below
            table = _rope_table(self.config, self.rows, int(poss.max()) + 1)
        return table[0][poss], table[1][poss]

    def _w(self, name: str) -> np.ndarray:
        return in_float32(self.arrays, name, self.dtype)

    def _attention(self, items: Items, q: np.ndarray) -> np.ndarray:
        """q (B, R, nh, hd_r) -> (B, R, nh * hd_r). Item b attends to the positions <= poss[b] of its
        request's cache; every core runs over the m entries the fullest of them holds (masked where its
        own are fewer); scores, the softmax max and sum, and the weighted V sum reduce over the cores."""
        if self.coll.fast:
            return self._attention_flow(items, q)
        slots, poss = items.slots, items.poss
        B, nkv, m = len(slots), self.config.n_kv_heads, self.kv.held_most(slots)
        rep, coll, qg = self.config.n_heads // nkv, self.coll, q.reshape(B, self.rows, nkv, -1, self.hd_r)
        kc, vc = self.kv.read(slots, m)  # (B, R, nkv, hd_r, m*C), (B, C, nkv, m, R*hd_r)
        valid, L = self.kv.visible(slots, poss, m), int(poss.max()) + 1  # (B, m, C); the fullest context
        if self.attention.keys_kept(L) < L:  # sparse: predict, keep the top K, a block of kept keys per head
            kc, vc, valid, m = sparse.hop_selection(self, qg, (slots, poss), (kc, vc, valid))
            part = np.matmul(qg[..., None, :], kc)[..., 0, :]  # (B, R, nkv, rep, m*C)
        else:
            part, valid = np.matmul(qg, kc), valid[:, None, None]  # (B, R, nkv, rep, m*C); (B, 1, 1, m, C)
        self.ledger.compute(2 * B * nkv * rep * self.hd_r * m)
        part = part.reshape(B, self.rows, nkv, rep, m, self.cols)
        scores = self.cy.allreduce(part, coll, slices=Slices(1), collapse=True,
                                   overwrite=True)  # (B, nkv, rep, m, C)
        scores = np.where(valid, scores * self.scale, np.float32(-np.inf))
        top = self.cx.allreduce(scores.max(axis=3), coll, "max", Slices(3, replicated=True),
                                collapse=True)  # (B, nkv, rep)
        e = np.where(valid, np.exp(scores - top[..., None, None]), np.float32(0))
        total = self.cx.allreduce(e.sum(axis=3), coll, slices=Slices(3, replicated=True),
                                  collapse=True)  # (B, nkv, rep)
        p = (e / total[..., None, None]).transpose(0, 4, 1, 2, 3)  # (B, C, nkv, rep, m)
        self.ledger.compute(EW["softmax"] * B * nkv * rep * m)
        out = np.matmul(p, vc) if vc.ndim == 5 else np.matmul(p[..., None, :], vc)[..., 0, :]  # (B, C, nkv, rep, R*hd)
        self.ledger.compute(2 * B * nkv * rep * self.hd_r * m)
        out = out.reshape(B, self.cols, nkv, rep, self.rows, self.hd_r)
        a = self.cx.allreduce(out, coll, slices=Slices(1), collapse=True,
                              overwrite=True)  # (B, nkv, rep, R, hd_r)
        return a.transpose(0, 3, 1, 2, 4).reshape(B, self.rows, -1)

    def _attention_flow(self, items: Items, q: np.ndarray) -> np.ndarray:
        """_attention on the fast path (FlowKVCache): every item against its request's positions at once, in
        position order; booked as the cores run it (over the m entries the fullest core holds). The softmax
        runs in the scores' buffer (the same operations in the same order)."""
        slots, poss, L = items.slots, items.poss, items.length
        B, nkv, m, R = len(slots), self.config.n_kv_heads, self.kv.held_most(items.rows), self.rows
        rep, coll = self.config.n_heads // nkv, self.coll
        work = B * nkv * rep
        kc, vc = self.kv.read(items.rows, L)  # (B, nkv, R*hd_r, L), (B, nkv, L, R*hd_r)
        qg = q.reshape(B, R, nkv, rep, self.hd_r).transpose(0, 2, 3, 1, 4).reshape(B, nkv, rep, -1)
        hidden = items.hidden  # (B, 1, 1, L)
        if self.attention.keys_kept(L) < L:  # sparse: predict, keep the top K, attend over those
            visible, m = self._sparse(qg, slots, poss, ~hidden, m)
            hidden = ~visible
        scores = np.matmul(qg, kc)  # (B, nkv, rep, L)
        scores *= self.scale
        self.ledger.compute(2 * work * self.hd_r * m)
        book_allreduce(self.cy, coll, work * m * self.cols)  # every core's partial scores, over the rows
        np.copyto(scores, np.float32(-np.inf), where=hidden)
        scores -= scores.max(axis=3, keepdims=True)
        e = np.exp(scores, out=scores)
        book_allreduce(self.cx, coll, work, replicated=True)  # the max over the columns
        e /= e.sum(axis=3, keepdims=True)
        book_allreduce(self.cx, coll, work, replicated=True)  # the sum
        self.ledger.compute(EW["softmax"] * work * m)
        out = np.matmul(e, vc)  # (B, nkv, rep, R*hd_r)
        self.ledger.compute(2 * work * self.hd_r * m)
        book_allreduce(self.cx, coll, work * R * self.hd_r)  # the weighted V sums, over the columns
        return out.reshape(B, nkv, rep, R, self.hd_r).transpose(0, 3, 1, 2, 4).reshape(B, R, -1)

    def _sparse(self, qg: np.ndarray, slots: np.ndarray, poss: np.ndarray, visible: np.ndarray, held: int):
        """STAR's prediction and top-K (waferrt.decode.sparse), booked: -> (the mask of the keys each query head
        attends to (B, nkv, rep, L), the keys a core attends to)."""
        L = visible.shape[-1]
        keep, (uniq, which) = self.attention.keys_kept(L), np.unique(slots, return_inverse=True)
        row = TopKRow(self.cols, held, qg.shape[0] * qg.shape[1] * qg.shape[2], keep)
        pred = sparse.predicted(qg, (self.kv.read(uniq, L)[0], which), visible)  # (B, nkv, rep, L)
        sparse.book_prediction(self.ledger, row, self.hd_r)
        book_allreduce(self.cy, self.coll, row.heads * held * self.cols)  # the partial predictions, over the rows
        sparse.book_top_k(self.ledger, row, self.rows)
        return visible & sparse.chosen(pred, poss, self.attention), min(keep, held)

    # -- a batch of tokens ------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, slots: np.ndarray, poss: np.ndarray) -> np.ndarray:
        """x (B, C, dim_c) -> (B, C, dim_c): item b is the token at position poss[b] of the request in
        slots[b] (items of one request in position order: a prompt goes through all at once)."""
        return self.run(x, Items.of(slots, poss))

    def run(self, x: np.ndarray, items: Items) -> np.ndarray:
        """forward with the items worked out once for every layer of a segment (Items)."""
        config, nh, nkv, B = self.config, self.config.n_heads, self.config.n_kv_heads, len(items.slots)
        with self.ledger.op("layer"):
            with self._bookings(B):  # the same bookings for the same number of items
                h = mesh_rmsnorm(self.cx, x, self._w("attn_norm"), config, self.coll)
                qkv = mesh_gemv(self.cx, self.coll, self._w("wqkv"), h).reshape(B, self.rows, -1, self.hd_r)
                qk = rotate(qkv[:, :, :nh + nkv], *items.rope(self))  # (B, R, nh + nkv, hd_r): q and k at once
                q, k = qk[:, :, :nh], qk[:, :, nh:]
                self.ledger.compute(EW["rope"] * B * (nh + nkv) * self.hd_r)
            self.kv.insert(items.slots, k, qkv[:, :, nh + nkv:], items.poss)
            with self._bookings(B, self.kv.held_most(items.rows)):  # ... and entries the fullest core holds
                x = x + mesh_gemv(self.cy, self.coll, self._w("wo"), self._attention(items, q))
                self.ledger.compute(EW["residual"] * x.shape[0] * x.shape[2])
                x = x + self._ffn(mesh_rmsnorm(self.cx, x, self._w("ffn_norm"), config, self.coll))
                self.ledger.compute(EW["residual"] * x.shape[0] * x.shape[2])
            return x

    def _bookings(self, *key: int):
        """Where the bookings of a part of `run` depend on `key` alone -- the fast path, dense attention, no
        link tap listening -- book them once per key and then their sum at once (Ledger.replay)."""
        if self.coll.fast and self.attention.dense and self.cx.tap is None and self.cy.tap is None:
            return self.ledger.replay(self._booked, key)
        return contextlib.nullcontext()

    def _ffn(self, h: np.ndarray) -> np.ndarray:
        """The dense SwiGLU FFN of h (B, C, dim_c) -> (B, C, dim_c) (waferrt.decode.moe: an MoE layer's)."""
        gu = mesh_gemv(self.cx, self.coll, self._w("w13"), h).reshape(len(h), self.rows, 2, -1)  # (B, R, 2, hid_r)
        self.ledger.compute(EW["silu_mul"] * len(h) * gu.shape[3])
        return mesh_gemv(self.cy, self.coll, self._w("w2"), silu(gu[:, :, 0]) * gu[:, :, 1])


def table_rows(table: np.ndarray, vocab: Chunks, dtype: str, tokens: np.ndarray) -> np.ndarray:
    """Rows `tokens` (B,) of a packed tied table (R*voc_r, C*dim_c; vocab: its Chunks over the R rows) as
    float32 (B, C*dim_c)."""
    voc_r = table.shape[0] // vocab.index.shape[0]
    rows = np.searchsorted(vocab.index[:, 0], tokens, side="right") - 1
    return to_f32(table[rows * voc_r + tokens - vocab.index[rows, 0]], dtype)  # (B, C*dim_c)


class EmbedShard:
    def __init__(self, config: LlamaConfig, region: Region, arrays: dict, ledger: Ledger,
                 coll: Collectives = KTREE_FAST, dtype: str = "float32"):
        self.config, self.region, self.ledger, self.coll, self.dtype = config, region, ledger, coll, dtype
        self.arrays = arrays  # "table" (R*voc_r, C*dim_c), "final_norm" (C, dim_c)
        self.rows, self.cols = region.h, region.w
        self.vocab = Chunks(config.vocab_size, region.h)
        self.cx = LineComm("x", Span.of(region), ledger, fast=coll.fast)

    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """The embedding rows of `tokens` (B,), each as (C, dim_c) in the core row that holds it."""
        return table_rows(self.arrays["table"], self.vocab, self.dtype, tokens).reshape(len(tokens), self.cols, -1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final RMSNorm and the tied head as a MeshGEMV: x (B, C, dim_c) -> logits (B, vocab)."""
        with self.ledger.op("head"):
            h = mesh_rmsnorm(self.cx, x, in_float32(self.arrays, "final_norm", self.dtype), self.config, self.coll)
            out = mesh_gemv(self.cx, self.coll, in_float32(self.arrays, "table", self.dtype), h)  # (B, R, voc_r)
        return self.vocab.join(out)  # (B, vocab)
