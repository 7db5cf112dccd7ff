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
from .decode_pack import Chunks, rope_tables
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
                 ledger: Ledger, algo: str = "ktree", k: int = 2):
        self.cfg, self.region, self.ledger, self.algo, self.k = cfg, region, ledger, algo, k
        self.w = arrays
        R, C = region.h, region.w
        self.rows, self.cols = R, C
        self.cx = LineComm("x", region, region, None, ledger)
        self.cy = LineComm("y", region, region, None, ledger)
        self.hd_r = arrays["wqkv"].shape[2] // (R * (cfg.n_heads + 2 * cfg.n_kv_heads))
        self.inv_freq, _ = rope_tables(cfg, R)  # (R, hd_r/2)
        self.cap = -(-kv_tokens // C)
        nkv = cfg.n_kv_heads
        self.k_cache = np.zeros((slots, R, C, nkv, self.hd_r, self.cap), np.float32)
        self.v_cache = np.zeros((slots, R, C, nkv, self.cap, self.hd_r), np.float32)
        self.pos = np.full((slots, C, self.cap), -1, np.int64)  # token position held in each slot
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

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

    def _kv_insert(self, s: int, k_new: np.ndarray, v_new: np.ndarray, pos: int) -> None:
        """Shift-based insertion of one position: k_new, v_new (R, nkv, hd_r)."""
        count = (self.pos[s] >= 0).sum(axis=1)  # (C,)
        shorter = np.nonzero(count < count[0])[0]
        if not len(shorter):  # all columns equal: the new entry simply lands in column 0
            if count[0] >= self.cap:
                raise KVCapacityError(f"the K/V cache of this layer is full ({self.cap * self.cols} positions)")
            free = int(np.argmin(self.pos[s, 0] >= 0))
            self.k_cache[s, :, 0, :, :, free] = k_new
            self.v_cache[s, :, 0, :, free, :] = v_new
            self.pos[s, 0, free] = pos
            return
        end = int(shorter[0])  # columns 0..end-1 pass their oldest entry one hop east
        cols = np.arange(end)
        oldest = np.argmin(np.where(self.pos[s, :end] >= 0, self.pos[s, :end], np.iinfo(np.int64).max), axis=1)
        out_k = self.k_cache[s, :, cols, :, :, oldest]  # (end, R, nkv, hd_r)
        out_v = self.v_cache[s, :, cols, :, oldest, :]
        out_p = self.pos[s, cols, oldest].astype(np.float32)
        send = np.zeros((self.cols, self.rows, 2, self.cfg.n_kv_heads, self.hd_r + 1), np.float32)
        send[:end, :, 0, :, :-1], send[:end, :, 1, :, :-1] = out_k, out_v
        send[:end, :, 0, 0, -1] = out_p[:, None]
        with self.ledger.op("kv.shift"):
            dst, got = self.cx.transfer(send, np.arange(end), 1, array_axis=0)
        free = int(np.argmin(self.pos[s, end] >= 0))
        slot = np.concatenate([oldest, [free]])
        k_in = np.concatenate([k_new[None], got[:, :, 0, :, :-1]])  # (end+1, R, nkv, hd_r)
        v_in = np.concatenate([v_new[None], got[:, :, 1, :, :-1]])
        p_in = np.concatenate([[pos], got[:, 0, 0, 0, -1].astype(np.int64)])
        targets = np.concatenate([[0], dst])
        self.k_cache[s, :, targets, :, :, slot] = k_in
        self.v_cache[s, :, targets, :, slot, :] = v_in
        self.pos[s, targets, slot] = p_in

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
        part = np.matmul(q.reshape(B, self.rows, 1, nkv, rep, self.hd_r), kc)  # (B, R, C, nkv, rep, cap)
        self.ledger.compute(2 * B * nkv * rep * self.hd_r * self.cap)
        scores = self.cy.allreduce(part, self.algo, self.k, array_axis=1, collapse=True,
                                   overwrite=True)  # (B, C, nkv, rep, cap)
        held = self.pos[slots]  # (B, C, cap)
        valid = ((held >= 0) & (held <= poss[:, None, None]))[:, :, None, None, :]
        scores = np.where(valid, scores * self.scale, np.float32(-np.inf))
        m = self.cx.allreduce(scores.max(axis=4), self.algo, self.k, op="max", array_axis=1, replicated=True,
                              collapse=True)  # (B, nkv, rep)
        e = np.where(valid, np.exp(scores - m[:, None, :, :, None]), np.float32(0))
        total = self.cx.allreduce(e.sum(axis=4), self.algo, self.k, array_axis=1, replicated=True,
                                  collapse=True)  # (B, nkv, rep)
        p = e / total[:, None, :, :, None]  # (B, C, nkv, rep, cap)
        out = np.matmul(p[:, None], vc)  # (B, R, C, nkv, rep, hd_r)
        self.ledger.compute(2 * B * nkv * rep * self.hd_r * self.cap)
        a = self.cx.allreduce(out, self.algo, self.k, array_axis=2, collapse=True,
                              overwrite=True)  # (B, R, nkv, rep, hd_r)
        return a.reshape(B, self.rows, -1)

    # -- a batch of tokens ------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, slots: np.ndarray, poss: np.ndarray) -> np.ndarray:
        """x (B, C, dim_c) -> (B, C, dim_c): item b is the token at position poss[b] of the request in
        slots[b] (items of one request in position order: a prompt goes through all at once)."""
        cfg, nh, nkv = self.cfg, self.cfg.n_heads, self.cfg.n_kv_heads
        with self.ledger.op("layer"):
            h = mesh_rmsnorm(self.cx, x, self.w["attn_norm"], cfg, self.algo, self.k)
            qkv = self._gemv_cols(self.w["wqkv"], h).reshape(len(slots), self.rows, -1, self.hd_r)
            ang = poss[:, None, None] * self.inv_freq[None]  # (B, R, hd_r/2), float64 like the reference
            cos, sin = np.cos(ang).astype(np.float32)[:, :, None], np.sin(ang).astype(np.float32)[:, :, None]
            q = _rope(qkv[:, :, :nh], cos, sin)  # (B, R, nh, hd_r)
            k = _rope(qkv[:, :, nh: nh + nkv], cos, sin)
            for b in range(len(slots)):
                self._kv_insert(int(slots[b]), k[b], qkv[b, :, nh + nkv:], int(poss[b]))
            x = x + self._gemv_rows(self.w["wo"], self._attention(slots, poss, q))
            h = mesh_rmsnorm(self.cx, x, self.w["ffn_norm"], cfg, self.algo, self.k)
            gu = self._gemv_cols(self.w["w13"], h).reshape(len(slots), self.rows, 2, -1)  # (B, R, 2, hid_r)
            return x + self._gemv_rows(self.w["w2"], _silu(gu[:, :, 0]) * gu[:, :, 1])

    def reset(self, slot: int) -> None:
        """Forget the request in `slot` (its cache positions become free)."""
        self.pos[slot] = -1

    def held(self, slot: int) -> np.ndarray:
        """Positions per column of the request in `slot` (to check the balance)."""
        return (self.pos[slot] >= 0).sum(axis=1)


class EmbedShard:
    def __init__(self, cfg: LlamaConfig, region: Region, arrays: dict, ledger: Ledger, algo: str = "ktree",
                 k: int = 2):
        self.cfg, self.region, self.ledger, self.algo, self.k = cfg, region, ledger, algo, k
        self.table, self.norm = arrays["table"], arrays["final_norm"]  # (C, dim_c, R*voc_r), (C, dim_c)
        self.rows, self.cols = region.h, region.w
        self.vocab = Chunks(cfg.vocab_size, region.h)
        self.voc_r = self.table.shape[2] // region.h
        self.cx = LineComm("x", region, region, None, ledger)

    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """The embedding rows of `tokens` (B,), each as (C, dim_c) in the core row that holds it."""
        rows = np.searchsorted(self.vocab.index[:, 0], tokens, side="right") - 1
        col = rows * self.voc_r + tokens - self.vocab.index[rows, 0]
        return np.ascontiguousarray(self.table[:, :, col].transpose(2, 0, 1))  # (B, C, dim_c)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final RMSNorm and the tied head as a MeshGEMV: x (B, C, dim_c) -> logits (B, vocab)."""
        with self.ledger.op("head"):
            h = mesh_rmsnorm(self.cx, x, self.norm, self.cfg, self.algo, self.k)
            part = np.matmul(h.transpose(1, 0, 2), self.table)  # (C, B, R*voc_r)
            self.ledger.compute(2 * x.shape[0] * self.voc_r * self.table.shape[1])
            part = part.reshape(self.cols, x.shape[0], self.rows, -1)
            out = self.cx.allreduce(part, self.algo, self.k, collapse=True)  # (B, R, voc_r)
        return np.stack([self.vocab.join(o) for o in out])
