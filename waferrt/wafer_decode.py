"""One decoder layer and the embedding/head, run by the cores of their regions (MeshGEMV decode).

Contract: a :class:`LayerShard` holds one layer's weight blocks (waferrt.decode_pack) and the K/V caches
of up to ``slots`` requests in the cores of its region, and runs one token of one request through the
layer with :meth:`LayerShard.forward`. Every data movement between cores is a collective of
waferrt.comm (booked in the ledger); the math per core is local. The residual stream enters and leaves
as x (cols, dim_c): split over the region's columns, replicated down its rows (one copy kept).

K/V caches: (slots, rows, cols, n_kv, head_dim_r, cap) for K and (..., cap, head_dim_r) for V: head_dim
over rows, positions over columns, cap positions per core. A new position enters at column 0; when
column 0 holds more than the last column, the columns up to the first shorter one each pass their
oldest entry one hop east (WaferLLM's shift-based KV cache), so every column's share differs by at most
one. :class:`EmbedShard` holds the tied embedding table: it looks a token's row up and, with the final
norm, computes the logits.
"""

from __future__ import annotations

import numpy as np

from .comm import LineComm
from .decode_pack import Chunks, rope_tables, storage_dtype, to_f32, to_storage
from .ledger import Ledger
from .mesh import Region
from .model.config import LlamaConfig


class KVCapacityError(MemoryError):
    pass


def _silu(x: np.ndarray) -> np.ndarray:
    half = np.float32(0.5)
    return x * (half + half * np.tanh(half * x))


def mesh_rmsnorm(comm: LineComm, x: np.ndarray, w: np.ndarray, cfg: LlamaConfig, algo: str, k: int
                 ) -> np.ndarray:
    """RMSNorm of x (B, C, dim_c), split over the columns of `comm`'s line: the sum of squares is a row
    allreduce (every row does the same one: one copy is kept)."""
    ss = comm.allreduce((x * x).sum(axis=2), algo, k, array_axis=1, replicated=True, collapse=True)  # (B,)
    scale = np.float32(1.0) / np.sqrt(ss / np.float32(cfg.dim) + np.float32(cfg.norm_eps))
    return x * scale[:, None, None] * w


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Adjacent pairs of x (rows, heads, hd_r) rotated by cos/sin (rows, 1, hd_r // 2)."""
    p = x.reshape(x.shape[:-1] + (-1, 2))
    out = np.empty_like(p)
    out[..., 0] = p[..., 0] * cos - p[..., 1] * sin
    out[..., 1] = p[..., 0] * sin + p[..., 1] * cos
    return out.reshape(x.shape)


class LayerShard:
    def __init__(self, cfg: LlamaConfig, region: Region, arrays: dict, slots: int, kv_tokens: int,
                 ledger: Ledger, algo: str = "ktree", k: int = 2, dtype: str = "float32"):
        self.cfg, self.region, self.ledger, self.algo, self.k = cfg, region, ledger, algo, k
        self.arrays, self.dtype = arrays, dtype  # weights and K/V are stored in `dtype`, computed in float32
        R, C = region.h, region.w
        self.rows, self.cols = R, C
        self.cx = LineComm("x", region, region, None, ledger)
        self.cy = LineComm("y", region, region, None, ledger)
        self.hd_r = arrays["wqkv"].shape[2] // (R * (cfg.n_heads + 2 * cfg.n_kv_heads))
        store = storage_dtype(dtype)
        self.inv_freq, _ = rope_tables(cfg, R)  # (R, hd_r/2)
        self.cap = -(-kv_tokens // C)
        nkv = cfg.n_kv_heads
        # K as (.., hd_r, C, cap): one core's dims against every cached position is a single matmul
        self.k_cache = np.zeros((slots, R, nkv, self.hd_r, C, self.cap), store)
        # V as (C, nkv, cap, R, hd_r): a column's weights times its cached values is one matmul per head
        self.v_cache = np.zeros((slots, C, nkv, self.cap, R, self.hd_r), store)
        self.pos = np.zeros((slots, C, self.cap), np.int64)  # token position held in each cache entry
        self.head = np.zeros((slots, C), np.int64)  # each column's oldest entry
        self.count = np.zeros((slots, C), np.int64)  # entries each column holds
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

    def _w(self, name: str) -> np.ndarray:
        return to_f32(self.arrays[name], self.dtype)

    # -- pieces: every array carries the batch axis B first -------------------------------------------------
    def _gemv_cols(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Input split over columns: w (C, i, R*o), x (B, C, i) -> (B, R, o), split over rows."""
        part = np.matmul(x.transpose(1, 0, 2), w)  # (C, B, R*o): every core's block GEMV, all items
        self.ledger.compute(2 * x.shape[0] * w.shape[1] * w.shape[2] // self.rows)
        part = part.reshape(self.cols, x.shape[0], self.rows, -1)
        return self.cx.allreduce(part, self.algo, self.k, array_axis=0, collapse=True, overwrite=True)

    def _gemv_rows(self, w: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Input split over rows: w (R, i, C*o), h (B, R, i) -> (B, C, o), split over columns."""
        part = np.matmul(h.transpose(1, 0, 2), w)  # (R, B, C*o)
        self.ledger.compute(2 * h.shape[0] * w.shape[1] * w.shape[2] // self.cols)
        part = part.reshape(self.rows, h.shape[0], self.cols, -1)
        return self.cy.allreduce(part, self.algo, self.k, array_axis=0, collapse=True, overwrite=True)

    def _kv_insert(self, slots: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray) -> None:
        """Shift-based insertion of one position for each item: k_new, v_new (B, R, nkv, hd_r). Each column
        keeps a request's entries as a FIFO ring (head = oldest, count); column 0 takes the new entry and
        columns 0..end-1 pass their oldest one hop east, end being the first column that holds fewer than
        column 0. Items of different requests shift together; a request's own items go in turn."""
        order = np.zeros(len(slots), np.int64)  # the how-many-th item of its request each item is
        for i in range(1, len(slots)):
            order[i] = np.count_nonzero(slots[:i] == slots[i])
        for r in range(int(order.max()) + 1):
            sel = np.flatnonzero(order == r)
            self._kv_insert_distinct(slots[sel], k_new[sel], v_new[sel], poss[sel])

    def _kv_insert_distinct(self, S: np.ndarray, k_new, v_new, poss) -> None:
        count, head = self.count[S], self.head[S]  # (n, C) copies
        less = count < count[:, :1]
        end = np.where(less.any(axis=1), less.argmax(axis=1), 0)  # (n,)
        full = (end == 0) & (count[:, 0] >= self.cap)
        if full.any():
            raise KVCapacityError(f"the K/V cache of this layer is full ({self.cap * self.cols} positions) "
                                  f"for the request in slot {int(S[full][0])}; admission should have refused it")
        cols = np.arange(self.cols)
        moving = cols[None, :] < end[:, None]  # (n, C): these columns pass their oldest entry east
        incoming = cols[None, :] <= end[:, None]  # (n, C): these columns take an entry
        ki, vi = k_new[:, None], v_new[:, None]  # (n, 1, R, nkv, hd_r): what column 0 takes
        pi = poss[:, None]
        if moving.any():
            b, c = np.nonzero(moving)
            send = np.zeros((self.cols, len(S), self.rows, 2, self.cfg.n_kv_heads, self.hd_r + 1), np.float32)
            send[c, b, :, 0, :, :-1] = to_f32(self.k_cache[S[b], :, :, :, c, head[b, c]], self.dtype)
            v_out = to_f32(self.v_cache[S[b], c, :, head[b, c]], self.dtype)  # (pairs, nkv, R, hd_r)
            send[c, b, :, 1, :, :-1] = v_out.transpose(0, 2, 1, 3)
            send[c, b, :, 0, 0, -1] = self.pos[S[b], c, head[b, c]][:, None]
            with self.ledger.op("kv.shift"):
                _, got = self.cx.transfer(send, np.arange(int(end.max())), 1, array_axis=0)
            got = got.swapaxes(0, 1)  # (n, max_end, R, 2, nkv, hd_r + 1): what columns 1.. received
            ki = np.concatenate([ki, got[:, :, :, 0, :, :-1]], axis=1)
            vi = np.concatenate([vi, got[:, :, :, 1, :, :-1]], axis=1)
            pi = np.concatenate([pi, got[:, :, 0, 0, 0, -1].astype(np.int64)], axis=1)
            head = np.where(moving, (head + 1) % self.cap, head)  # the oldest left
        b, c = np.nonzero(incoming)
        tail = (head[b, c] + count[b, c] - moving[b, c]) % self.cap
        self.k_cache[S[b], :, :, :, c, tail] = to_storage(ki[b, c], self.dtype)
        self.v_cache[S[b], c, :, tail] = to_storage(vi[b, c].transpose(0, 2, 1, 3), self.dtype)
        self.pos[S[b], c, tail] = pi[b, c]
        self.head[S] = head
        self.count[S, end] += 1

    def _attention(self, slots: np.ndarray, poss: np.ndarray, q: np.ndarray) -> np.ndarray:
        """q (B, R, nh, hd_r) -> (B, R, nh * hd_r). Item b attends to the positions <= poss[b] of its
        request's cache; scores, the softmax max and sum, and the weighted V sum reduce over the cores."""
        B, nkv = len(slots), self.cfg.n_kv_heads
        rep = self.cfg.n_heads // nkv
        first = int(slots[0])
        if np.array_equal(slots, np.arange(first, first + B)):  # consecutive slots: a view, no copy
            kc, vc = self.k_cache[first:first + B], self.v_cache[first:first + B]
        else:
            kc, vc = self.k_cache[slots], self.v_cache[slots]
        kc = to_f32(kc, self.dtype).reshape(B, self.rows, nkv, self.hd_r, -1)  # (B, R, nkv, hd_r, C*cap)
        vc = to_f32(vc, self.dtype)
        part = np.matmul(q.reshape(B, self.rows, nkv, rep, self.hd_r), kc)  # (B, R, nkv, rep, C*cap)
        self.ledger.compute(2 * B * nkv * rep * self.hd_r * self.cap)
        part = part.reshape(B, self.rows, nkv, rep, self.cols, self.cap)
        scores = self.cy.allreduce(part, self.algo, self.k, array_axis=1, collapse=True,
                                   overwrite=True)  # (B, nkv, rep, C, cap)
        ring = (np.arange(self.cap) - self.head[slots][:, :, None]) % self.cap  # (B, C, cap)
        causal = self.pos[slots] <= poss[:, None, None]  # (B, C, cap): no item sees a later position
        valid = ((ring < self.count[slots][:, :, None]) & causal)[:, None, None]
        scores = np.where(valid, scores * self.scale, np.float32(-np.inf))
        m = self.cx.allreduce(scores.max(axis=4), self.algo, self.k, op="max", array_axis=3, replicated=True,
                              collapse=True)  # (B, nkv, rep)
        e = np.where(valid, np.exp(scores - m[..., None, None]), np.float32(0))
        total = self.cx.allreduce(e.sum(axis=4), self.algo, self.k, array_axis=3, replicated=True,
                                  collapse=True)  # (B, nkv, rep)
        p = (e / total[..., None, None]).transpose(0, 3, 1, 2, 4)  # (B, C, nkv, rep, cap)
        out = np.matmul(p, vc.reshape(B, self.cols, nkv, self.cap, -1))  # (B, C, nkv, rep, R*hd_r)
        self.ledger.compute(2 * B * nkv * rep * self.hd_r * self.cap)
        out = out.reshape(B, self.cols, nkv, rep, self.rows, self.hd_r)
        a = self.cx.allreduce(out, self.algo, self.k, array_axis=1, collapse=True,
                              overwrite=True)  # (B, nkv, rep, R, hd_r)
        return a.transpose(0, 3, 1, 2, 4).reshape(B, self.rows, -1)

    # -- a batch of tokens ------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, slots: np.ndarray, poss: np.ndarray) -> np.ndarray:
        """x (B, C, dim_c) -> (B, C, dim_c): item b is the token at position poss[b] of the request in
        slots[b] (items of one request in position order: a prompt goes through all at once)."""
        cfg, nh, nkv = self.cfg, self.cfg.n_heads, self.cfg.n_kv_heads
        with self.ledger.op("layer"):
            h = mesh_rmsnorm(self.cx, x, self._w("attn_norm"), cfg, self.algo, self.k)
            qkv = self._gemv_cols(self._w("wqkv"), h).reshape(len(slots), self.rows, -1, self.hd_r)
            ang = poss[:, None, None] * self.inv_freq[None]  # (B, R, hd_r/2), float64 like the reference
            cos, sin = np.cos(ang).astype(np.float32)[:, :, None], np.sin(ang).astype(np.float32)[:, :, None]
            q = _rope(qkv[:, :, :nh], cos, sin)  # (B, R, nh, hd_r)
            k = _rope(qkv[:, :, nh: nh + nkv], cos, sin)
            self._kv_insert(slots, k, qkv[:, :, nh + nkv:], poss)
            x = x + self._gemv_rows(self._w("wo"), self._attention(slots, poss, q))
            h = mesh_rmsnorm(self.cx, x, self._w("ffn_norm"), cfg, self.algo, self.k)
            gu = self._gemv_cols(self._w("w13"), h).reshape(len(slots), self.rows, 2, -1)  # (B, R, 2, hid_r)
            return x + self._gemv_rows(self._w("w2"), _silu(gu[:, :, 0]) * gu[:, :, 1])

    def reset(self, slot: int) -> None:
        """Forget the request in `slot` (its cache positions become free)."""
        self.count[slot] = 0
        self.head[slot] = 0

    def held(self, slot: int) -> np.ndarray:
        """Positions per column of the request in `slot` (to check the balance)."""
        return self.count[slot].copy()

    def positions(self, slot: int) -> list[int]:
        """The token positions the cache of `slot` holds, every column's ring in order."""
        ring = (np.arange(self.cap) - self.head[slot][:, None]) % self.cap
        return sorted(self.pos[slot][ring < self.count[slot][:, None]].tolist())


class EmbedShard:
    def __init__(self, cfg: LlamaConfig, region: Region, arrays: dict, ledger: Ledger, algo: str = "ktree",
                 k: int = 2, dtype: str = "float32"):
        self.cfg, self.region, self.ledger, self.algo, self.k = cfg, region, ledger, algo, k
        self.table, self.norm = arrays["table"], arrays["final_norm"]  # (C, dim_c, R*voc_r), (C, dim_c)
        self.dtype = dtype
        self.rows, self.cols = region.h, region.w
        self.vocab = Chunks(cfg.vocab_size, region.h)
        self.voc_r = self.table.shape[2] // region.h
        self.cx = LineComm("x", region, region, None, ledger)

    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """The embedding rows of `tokens` (B,), each as (C, dim_c) in the core row that holds it."""
        rows = np.searchsorted(self.vocab.index[:, 0], tokens, side="right") - 1
        col = rows * self.voc_r + tokens - self.vocab.index[rows, 0]
        rows_of_table = to_f32(self.table[:, :, col], self.dtype)  # (C, dim_c, B)
        return np.ascontiguousarray(rows_of_table.transpose(2, 0, 1))  # (B, C, dim_c)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final RMSNorm and the tied head as a MeshGEMV: x (B, C, dim_c) -> logits (B, vocab)."""
        with self.ledger.op("head"):
            h = mesh_rmsnorm(self.cx, x, to_f32(self.norm, self.dtype), self.cfg, self.algo, self.k)
            part = np.matmul(h.transpose(1, 0, 2), to_f32(self.table, self.dtype))  # (C, B, R*voc_r)
            self.ledger.compute(2 * x.shape[0] * self.voc_r * self.table.shape[1])
            part = part.reshape(self.cols, x.shape[0], self.rows, -1)
            out = self.cx.allreduce(part, self.algo, self.k, collapse=True)  # (B, R, voc_r)
        return self.vocab.join(out)  # (B, vocab)
