"""One decoder layer and the embedding/head, run by the cores of their regions (MeshGEMV decode).

Contract: a :class:`LayerShard` holds one layer's weight blocks (waferrt.decode.pack) and the K/V caches
of its requests (:class:`~waferrt.decode.kvcache.MeshKVCache`) in the cores of its region, and runs a
micro-batch of tokens through the layer with :meth:`LayerShard.forward`. Every data movement between
cores is a collective of waferrt.fabric.comm (booked in the ledger); the math per core is local and uses
the reference's ops (waferrt.model.reference: RoPE on adjacent pairs, SiLU), booked as flops: the block
GEMVs and attention products by their multiply-adds, the element-wise work (RMSNorm, RoPE, softmax, SiLU,
residual adds) at waferrt.decode.decoding.ELEMENTWISE_FLOPS per element. The residual stream enters
and leaves as x (B, cols, dim_c): split over the region's columns, replicated down its rows (one copy
kept). :class:`EmbedShard` holds the tied embedding table: it looks a token's row up and, with the final
norm, computes the logits.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from waferrt.core.dtypes import to_f32
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.fabric.comm import KTREE_FAST, Collectives, LineComm, Span
from waferrt.kernels.attention import softmax
from waferrt.kernels.train_ops import Norm
from waferrt.model.config import LlamaConfig
from waferrt.model.reference import silu

from . import sparse
from .decoding import Decoding
from .kvcache import KVCapacity, KVView, MeshKVCache, as_slice
from .net import Net, net_of
from .pack import Chunks, rope_tables


def mesh_rmsnorm(net: Net, comm: LineComm, x: np.ndarray, w: np.ndarray, norm: Norm) -> np.ndarray:
    """RMSNorm of x over its features, split over the cores of `comm`'s line (the decode's x (B, C, dim_c): every
    row of its region does the same one, one copy kept; training's blocks (rows, cols, tokens, width): the
    features over the columns): the sum of squares is a reduction along the line (``net.norm2``, one value per
    token) -> x's shape."""
    ss = net.norm2(comm, x)  # per token: (B,) / (rows, cols, tokens)
    net.elementwise(comm, "rmsnorm", x)
    scale = np.float32(1.0) / np.sqrt(ss / np.float32(norm.dim) + np.float32(norm.eps))
    out = x * scale.reshape(scale.shape + (1,) * (x.ndim - scale.ndim))
    out *= w
    return out


@functools.cache
def norm_of(config: LlamaConfig) -> Norm:
    """The model's RMSNorm (its width and epsilon) as mesh_rmsnorm takes it."""
    return Norm(config.dim, config.norm_eps)


@functools.lru_cache(maxsize=8)
def _rope_table(config: LlamaConfig, rows: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (positions, rows, 1, hd_r/2) float32 of every position up to `positions` for a region of
    `rows` rows (waferrt.decode.pack.rope_tables' pairs), the angles computed in float64 and rounded once."""
    inv_freq, _ = rope_tables(config, rows)  # (R, hd_r/2)
    ang = np.arange(positions, dtype=np.float64)[:, None, None] * inv_freq[None]  # (P, R, hd_r/2)
    return np.cos(ang).astype(np.float32)[:, :, None], np.sin(ang).astype(np.float32)[:, :, None]


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
    angles: dict = field(default_factory=dict, repr=False)  # rows of a region -> its Angles

    def __post_init__(self) -> None:
        if self.slots.shape != self.poss.shape or self.slots.ndim != 1:
            raise ValueError(f"Items: slots {self.slots.shape} and positions {self.poss.shape} are one per item")

    @classmethod
    def of(cls, slots: np.ndarray, poss: np.ndarray) -> Items:
        length = int(poss.max()) + 1 if len(poss) else 0
        return cls(slots, poss, length, as_slice(slots), (np.arange(length)[None] > poss[:, None])[:, None, None])

    def rope(self, shard: LayerShard) -> Angles:
        """The RoPE angles pair by pair (B, R, 1, hd_r) of the items' positions for `shard`'s rows
        (LayerShard._rope; what `rotate` takes), worked out once per row count."""
        if shard.rows not in self.angles:
            self.angles[shard.rows] = pairwise(*shard._rope(self.poss))  # from (B, R, 1, hd_r/2)
        return self.angles[shard.rows]


@dataclass(frozen=True, eq=False)
class Angles:
    """RoPE's angles as `rotate` takes them, pair by pair over the last axis (..., hd): `cos2` is (cos, cos) and
    `sin2` is (-sin, sin) of each pair's angle."""

    cos2: np.ndarray
    sin2: np.ndarray


def pairwise(cos: np.ndarray, sin: np.ndarray) -> Angles:
    """RoPE's cos, sin (..., hd/2) as `rotate` takes them (..., hd)."""
    return Angles(np.repeat(cos, 2, axis=-1), np.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], -1))


def rotate(x: np.ndarray, angles: Angles) -> np.ndarray:
    """reference.apply_rope in three operations, bit for bit: x (..., hd) at `angles` (Items.rope).
    Pair (a, b) -> (a cos + b (-sin), b cos + a sin) = (a cos - b sin, a sin + b cos) (negation is exact, a sum is
    the same either way round)."""
    swapped = x.reshape(*x.shape[:-1], -1, 2)[..., ::-1].reshape(x.shape)  # (b, a) of every pair
    out = x * angles.cos2
    out += swapped * angles.sin2
    return out


@dataclass(frozen=True)
class On:
    """Where a layer's block functions run and what they read: the :class:`~waferrt.decode.net.Net` and the x-
    and y-lines of its cores (the decode's region; the prefill's square; None inside training's kernel, whose
    KernelNet holds its lines), the model, and its weights by name (`w(name)`: what the Net's projections take
    -- the decode's packed blocks in float32, the prefill's carried MeshGEMM blocks, training's
    decode.net.Parts)."""

    net: Net
    cx: LineComm | None
    cy: LineComm | None
    config: LlamaConfig
    w: Callable[[str], object]


def attention_in(on: On, x: np.ndarray, angles: Angles) -> tuple[np.ndarray, np.ndarray]:
    """The block up to its attention: x (B, C, dim_c) the residual stream -> the QKV projection of its RMSNorm
    (B, R, nh + 2 nkv, hd_r) and its query and key heads RoPE'd at `angles` (broadcasting to
    (B, R, 1, hd_r)) -> (B, R, nh + nkv, hd_r). The decode's B items over a region's R rows and C columns; the
    prefill's T tokens as one slab (R = C = 1) on its square; training's every core's block (rows, cols, mb,
    dim_c) -> (rows, cols, heads, mb * db), each head's (mb, db) block flattened."""
    config, net = on.config, on.net
    h = mesh_rmsnorm(net, on.cx, x, on.w("attn_norm"), norm_of(config))
    qkv = net.gemv(on.cx, on.w("wqkv"), h)  # (B, R, (nh + 2 nkv) * hd_r)
    qkv = qkv.reshape(*qkv.shape[:2], config.n_heads + 2 * config.n_kv_heads, -1)
    return qkv, rope(net, on.cy, qkv[:, :, :config.n_heads + config.n_kv_heads], angles)  # q and k at once


def rope(net: Net, comm: LineComm | None, x: np.ndarray, angles: Angles) -> np.ndarray:
    """RoPE on x (..., hd) at `angles` (broadcasting to x), element by element (every core its share) -> x's
    shape."""
    out = rotate(x, angles)
    net.elementwise(comm, "rope", out)
    return out


def attention_out(on: On, x: np.ndarray, att: np.ndarray, ffn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The block after its attention: x (B, C, dim_c) the residual stream, att (B, R, nh * hd_r) the heads'
    outputs -> :func:`ffn_residual` of :func:`attention_residual`, (B, C, dim_c)."""
    return ffn_residual(on, attention_residual(on, x, att), ffn)


def attention_residual(on: On, x: np.ndarray, att: np.ndarray) -> np.ndarray:
    """x + Wo att: x (B, C, dim_c) the residual stream, att (B, R, nh * hd_r) the heads' outputs -> x's shape."""
    return residual(on.net, on.cx, x, on.net.gemv(on.cy, on.w("wo"), att))


def ffn_residual(on: On, x: np.ndarray, ffn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """x + `ffn` (the dense MLP, :func:`dense_ffn`; an MoE layer's experts) of x's RMSNorm: x (B, C, dim_c) ->
    x's shape."""
    net, cx = on.net, on.cx
    return residual(net, cx, x, ffn(mesh_rmsnorm(net, cx, x, on.w("ffn_norm"), norm_of(on.config))))


def dense_ffn(on: On, h: np.ndarray) -> np.ndarray:
    """The dense layer's SwiGLU MLP (:func:`mlp`) of h (B, C, dim_c) with `on`'s weights."""
    return mlp(on.net, on.cx, on.cy, on.w("w13"), on.w("w2"), h)


def in_float32(arrays: dict, name: str, dtype: str) -> np.ndarray:
    """Block `name` of `arrays` in float32, the form the host computes with. On its first use a storage-dtype
    block is widened (exactly) and put in its place in `arrays`: the host holds each block once, in float32,
    from then on, and a decode step reads it as it is (it was converted for every micro-batch). A block put
    back at the storage dtype (a streamed layer's next blocks) is widened again on its use."""
    a = arrays[name]
    if a.dtype != np.float32:
        a = arrays[name] = to_f32(a, dtype)
    return a


def widen(arrays: dict, dtype: str) -> None:
    """Every block of `arrays` in float32 now (in_float32), the largest first: while a block is widened its
    storage form is held too, so the one held twice at the end is the smallest (a Llama3-8B layer's tile peaks
    at its float32 blocks + 34 MB, not + 117 MB when w2, its last-used, went last)."""
    for name in sorted(arrays, key=lambda n: -arrays[n].nbytes):
        in_float32(arrays, name, dtype)


class LayerShard:
    def __init__(self, dec: Decoding, region: Region, arrays: dict, kv: KVCapacity, ledger: Ledger):
        """`dec`: the model, the storage dtype, the collectives; `arrays` from pack_layer; `kv`: the requests
        and positions per request the K/V caches hold."""
        config, coll, dtype = dec.config, dec.coll, dec.dtype
        self.config, self.region, self.ledger, self.coll = config, region, ledger, coll
        self.arrays, self.dtype = arrays, dtype  # weights and K/V are stored in `dtype`, computed in float32
        # (the cores hold the blocks in `dtype`, what SRAM books; the host widens them once: in_float32)
        self.rows, self.cols = region.h, region.w
        self.cx = LineComm("x", Span.of(region), ledger, fast=coll.fast)
        self.cy = LineComm("y", Span.of(region), ledger, fast=coll.fast)
        self.net = net_of(coll)  # how this run's collectives run: fast, or hop by hop (waferrt.decode.net)
        self.on = On(self.net, self.cx, self.cy, config, self._w)  # what the block functions run on
        self.hd_r = arrays["wqkv"].shape[0] // (self.rows * (config.n_heads + 2 * config.n_kv_heads))
        self.kv = MeshKVCache(config, self.cx, kv, self.hd_r, dtype)
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
        request's cache; every core runs over the entries the fullest of them holds (masked where its own
        are fewer); scores, the softmax max and sum, and the weighted V sums reduce over the cores. Under a
        sparse mode with K below the context, STAR's (waferrt.decode.sparse): predict, keep the top K, attend
        over the kept keys alone in predicted order."""
        B, nkv, R = len(items.slots), self.config.n_kv_heads, self.rows
        qg = q.reshape(B, R, nkv, -1, self.hd_r).transpose(0, 2, 3, 1, 4)  # (B, nkv, rep, R, hd_r)
        dense = self.attention.keys_kept(items.length) >= items.length
        view = self.kv.view(items, dense)  # K (B, nkv, [R, hd_r], [positions]), V (B, nkv, [positions], R*hd_r)
        if not dense:
            out = (sparse.fast_attend if self.net.fast else sparse.hop_attend)(self, qg, items, view)
        else:
            out = self._dense(qg, view)
        return out.reshape(B, nkv, -1, R, self.hd_r).transpose(0, 3, 1, 2, 4).reshape(B, R, -1)

    def _dense(self, qg: np.ndarray, view: KVView) -> np.ndarray:
        """Every held key: qg (B, nkv, rep, R, hd_r) -> (B, nkv, rep, R*hd_r)."""
        net = self.net
        scores = net.dot(self.cy, net.split(qg), view.k, view.held)  # (B, nkv, rep, [positions]): over the rows
        scores *= self.scale
        e = softmax(net, self.cx, scores, view.hidden, view.held)  # its max and sum over the columns
        return net.dot(self.cx, e, view.v, view.held)  # the weighted V sums, over the columns

    # -- a batch of tokens ------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, slots: np.ndarray, poss: np.ndarray) -> np.ndarray:
        """x (B, C, dim_c) -> (B, C, dim_c): item b is the token at position poss[b] of the request in
        slots[b] (items of one request in position order: a prompt goes through all at once)."""
        return self.run(x, Items.of(slots, poss))

    def run(self, x: np.ndarray, items: Items) -> np.ndarray:
        """forward with the items worked out once for every layer of a segment (Items)."""
        nh, nkv, B = self.config.n_heads, self.config.n_kv_heads, len(items.slots)
        with self.ledger.op("layer"):
            with self._bookings(B):  # the same bookings for the same number of items
                qkv, qk = attention_in(self.on, x, items.rope(self))  # (B, R, nh + 2 nkv, hd_r), its q and k
            self.kv.insert(items.slots, qk[:, :, nh:], qkv[:, :, nh + nkv:], items.poss)
            with self._bookings(B, self.kv.held_most(items.rows)):  # ... and entries the fullest core holds
                return attention_out(self.on, x, self._attention(items, qk[:, :, :nh]), self._ffn)

    def _bookings(self, *key: int):
        """Where the bookings of a part of `run` depend on `key` alone -- the fast path, dense attention, no
        link tap listening -- book them once per key and then their sum at once (Ledger.replay)."""
        if self.coll.fast and self.attention.dense and self.cx.tap is None and self.cy.tap is None:
            return self.ledger.replay(self._booked, key)
        return contextlib.nullcontext()

    def _ffn(self, h: np.ndarray) -> np.ndarray:
        """The dense SwiGLU FFN of h (B, C, dim_c) -> (B, C, dim_c) (waferrt.decode.moe: an MoE layer's)."""
        return dense_ffn(self.on, h)


def mlp(net: Net, cx: LineComm, cy: LineComm, w13: np.ndarray, w2: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The SwiGLU MLP of h (B, C, dim_c) -> (B, C, dim_c) on a region whose x- and y-lines are cx, cy: w13 (the
    gate and up projections side by side) and w2 as packed for it (a dense layer's, or an MoE expert's block)."""
    gu = net.gemv(cx, w13, h)
    gu = gu.reshape(*gu.shape[:2], 2, -1)  # (B, R, 2, hid_r)
    act = swiglu(net, cy, gu[:, :, 0], gu[:, :, 1])  # (B, R, hid_r)
    return net.gemv(cy, w2, act)  # (B, C, dim_c)


def swiglu(net: Net, comm: LineComm | None, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SiLU(gate) * up, element by element (every core its share) -> gate's shape."""
    act = silu(gate) * up
    net.elementwise(comm, "silu_mul", act)
    return act


def residual(net: Net, comm: LineComm | None, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The residual add x + y, element by element (every core its share) -> x's shape."""
    out = x + y
    net.elementwise(comm, "residual", out)
    return out


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
        self.net = net_of(coll)

    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """The embedding rows of `tokens` (B,), each as (C, dim_c) in the core row that holds it."""
        return table_rows(self.arrays["table"], self.vocab, self.dtype, tokens).reshape(len(tokens), self.cols, -1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final RMSNorm and the tied head as a MeshGEMV: x (B, C, dim_c) -> logits (B, vocab)."""
        with self.ledger.op("head"):
            h = mesh_rmsnorm(self.net, self.cx, x, in_float32(self.arrays, "final_norm", self.dtype),
                             norm_of(self.config))
            out = self.net.gemv(self.cx, in_float32(self.arrays, "table", self.dtype), h)  # (B, R, voc_r)
        return self.vocab.join(out)  # (B, vocab)
