"""The K/V caches of one layer region: every request's keys and values stay in the region's cores.

Contract: a :class:`MeshKVCache` holds the K and V of up to ``slots`` requests for one layer, head_dim over
the region's rows and positions over its columns, ``cap`` positions per core (K as (slots, rows, n_kv,
hd_r, cap, cols), V as (slots, cols, n_kv, cap, rows, hd_r), stored in the storage dtype). A new position
enters at column 0; when column 0 then holds more than the last column, the columns up to the first
shorter one each pass their oldest entry one hop east over the region's x-line (WaferLLM's shift-based KV
cache, booked as "kv.shift"), so every column's share differs by at most one. Each column keeps a
request's entries oldest first from place 0 (``count`` of them) and the token position of every entry, so
attention runs over the entries the cores hold (``held_most``) and masks causally. Filling a request
beyond ``cap * cols`` positions raises :class:`KVCapacityError` (admission refuses such requests before
they start).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.dtypes import storage_dtype, to_f32, to_storage
from waferrt.fabric.comm import LineComm
from waferrt.model.config import LlamaConfig


def column_counts(tokens: int, cols: int) -> np.ndarray:
    """(cols,) how many of a request's `tokens` positions each column holds once the cache took them in order:
    tokens // cols + (c < tokens % cols) at column c (every column's share differs by at most one)."""
    return tokens // cols + (np.arange(cols) < tokens % cols)


def kv_columns(tokens: int, cols: int) -> np.ndarray:
    """(tokens,) the column holding each of a request's positions 0..tokens-1 once the cache took them in
    order: positions flow east oldest first, column c holding column_counts of them, the newest at column 0
    (both caches; tests/unit/test_relayout.py reads MeshKVCache's own)."""
    return np.repeat(np.arange(cols), column_counts(tokens, cols))[::-1].copy()  # newest first, read back oldest first


@dataclass(frozen=True, eq=False)
class KVView:
    """What attention reads of a layer's K/V cache for a micro-batch, in its cache's layout (the run's Net holds
    a split axis as that layout does: waferrt.decode.net): K (B, nkv, [R, hd_r], [positions]) and V (B, nkv,
    [positions], R*hd_r), `hidden` True where an item may not look (broadcasts against the scores), `held` the
    entries the fullest core holds (every core runs over that many)."""

    k: np.ndarray
    v: np.ndarray
    hidden: np.ndarray
    held: int


class KVCapacityError(MemoryError):
    """A request has more positions than its K/V cache holds."""


class MeshKVCache:
    def __init__(self, config: LlamaConfig, comm: LineComm, slots: int, kv_tokens: int, hd_r: int, dtype: str):
        region = comm.region  # comm: the region's x-line (columns), for the shifts
        self.rows, self.cols, self.nkv, self.hd_r = region.h, region.w, config.n_kv_heads, hd_r
        self.dtype, self.comm = dtype, comm
        self.cap = cdiv(kv_tokens, region.w)
        store = storage_dtype(dtype)
        # K as (.., hd_r, cap, C): one core's dims against every cached position is a single matmul, and
        # the first m places of every core are one contiguous run
        self.k = np.zeros((slots, self.rows, self.nkv, hd_r, self.cap, self.cols), store)
        # V as (C, nkv, cap, R, hd_r): a column's weights times its cached values is one matmul per head
        self.v = np.zeros((slots, self.cols, self.nkv, self.cap, self.rows, hd_r), store)
        self.pos = np.zeros((slots, self.cap, self.cols), np.int64)  # token position of each entry
        self.count = np.zeros((slots, self.cols), np.int64)  # entries each column holds, from place 0 on

    # -- writing ------------------------------------------------------------------------------------------
    def insert(self, slots: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray) -> None:
        """One new position for each item: k_new, v_new (B, R, nkv, hd_r). Items of different requests shift
        together; a request's own items (a prompt) go in turn, in position order. An item at position 0
        starts its request afresh: the slot's cache is emptied first (the slot may have held another)."""
        for slot in np.unique(slots[poss == 0]):
            self.reset(int(slot))
        order = _rounds(slots)
        for r in range(int(order.max()) + 1):
            sel = np.flatnonzero(order == r)
            self._insert_distinct(slots[sel], k_new[sel], v_new[sel], poss[sel])

    def _insert_distinct(self, S: np.ndarray, k_new, v_new, poss) -> None:
        count = self.count[S]  # (n, C) a copy
        less = count < count[:, :1]
        end = np.where(less.any(axis=1), less.argmax(axis=1), 0)  # (n,) first column shorter than column 0
        full = (end == 0) & (count[:, 0] >= self.cap)
        if full.any():
            raise KVCapacityError(f"the K/V cache of this layer is full ({self.cap * self.cols} positions) "
                                  f"for the request in slot {int(S[full][0])}; admission should have refused it")
        cols = np.arange(self.cols)
        moving = cols[None, :] < end[:, None]  # (n, C): these columns pass their oldest entry east
        incoming = cols[None, :] <= end[:, None]  # (n, C): these columns take an entry
        ki, vi, pi = k_new[:, None], v_new[:, None], poss[:, None]  # what column 0 takes
        if moving.any():
            got_k, got_v, got_p = self._shift_oldest(S, moving, int(end.max()), int(count[moving].max()))
            ki, vi = np.concatenate([ki, got_k], axis=1), np.concatenate([vi, got_v], axis=1)
            pi = np.concatenate([pi, got_p], axis=1)
        b, c = np.nonzero(incoming)
        tail = count[b, c] - moving[b, c]  # the newest entry goes last (a moving column lost its oldest)
        self.k[S[b], :, :, :, tail, c] = to_storage(ki[b, c], self.dtype)
        self.v[S[b], c, :, tail] = to_storage(vi[b, c].transpose(0, 2, 1, 3), self.dtype)
        self.pos[S[b], tail, c] = pi[b, c]
        self.count[S, end] += 1

    def _shift_oldest(self, S, moving, span: int, held: int):
        """The moving columns send their oldest entry (K, V and its position, one message per core) one hop
        east and move the rest (at most `held` entries) down one place. Returns what columns 1..span
        received: K, V (n, span, R, nkv, hd_r), positions (n, span)."""
        b, c = np.nonzero(moving)
        send = np.zeros((self.cols, len(S), self.rows, 2, self.nkv, self.hd_r + 1), np.float32)
        send[c, b, :, 0, :, :-1] = to_f32(self.k[S[b], :, :, :, 0, c], self.dtype)
        v_out = to_f32(self.v[S[b], c, :, 0], self.dtype)  # (pairs, nkv, R, hd_r)
        send[c, b, :, 1, :, :-1] = v_out.transpose(0, 2, 1, 3)
        send[c, b, :, 0, 0, -1] = self.pos[S[b], 0, c][:, None]
        self.k[S[b], :, :, :, :held - 1, c] = self.k[S[b], :, :, :, 1:held, c]  # oldest first, from place 0
        self.v[S[b], c, :, :held - 1] = self.v[S[b], c, :, 1:held]
        self.pos[S[b], :held - 1, c] = self.pos[S[b], 1:held, c]
        with self.comm.ledger.op("kv.shift"):
            _, got = self.comm.transfer(send, np.arange(span), 1, array_axis=0)
        got = got.swapaxes(0, 1)  # (n, span, R, 2, nkv, hd_r + 1)
        return got[:, :, :, 0, :, :-1], got[:, :, :, 1, :, :-1], got[:, :, 0, 0, 0, -1].astype(np.int64)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes + self.count.nbytes

    # -- reading ------------------------------------------------------------------------------------------
    def held_most(self, slots: np.ndarray) -> int:
        """The most entries any core holds for these requests: what attention runs over."""
        return int(self.count[slots].max())

    def read(self, slots: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 K (B, R, nkv, hd_r, m*C) and V (B, C, nkv, m, R*hd_r) of the items' requests: every
        core's first m entries (its oldest; a core holds its entries from place 0 on), place-major."""
        B = len(slots)
        k = to_f32(self.k[slots, :, :, :, :m], self.dtype).reshape(B, self.rows, self.nkv, self.hd_r, -1)
        return k, to_f32(self.v[slots, :, :, :m], self.dtype).reshape(B, self.cols, self.nkv, m, -1)

    def view(self, items) -> KVView:
        """The items' (waferrt.decode.shards.Items) K/V as every core holds it: K (B, nkv, R, hd_r, C, m), V (B,
        nkv, C, m, R*hd_r), hidden (B, 1, 1, C, m), over the m entries the fullest core holds."""
        m = self.held_most(items.slots)
        kc, vc = self.read(items.slots, m)
        B = len(items.slots)
        k = kc.reshape(B, self.rows, self.nkv, self.hd_r, m, self.cols).transpose(0, 2, 1, 3, 5, 4)
        hidden = ~self.visible(items.slots, items.poss, m).transpose(0, 2, 1)[:, None, None]
        return KVView(k, vc.transpose(0, 2, 1, 3, 4), hidden, m)

    def visible(self, slots: np.ndarray, poss: np.ndarray, m: int) -> np.ndarray:
        """(B, m, C): the entries item b may attend to -- held by its request, at positions <= poss[b]."""
        held = np.arange(m)[:, None] < self.count[slots][:, None, :]
        return held & (self.pos[slots, :m] <= poss[:, None, None])

    # -- bookkeeping --------------------------------------------------------------------------------------
    def reset(self, slot: int) -> None:
        """Forget the request in `slot` (its positions become free)."""
        self.count[slot] = 0

    def held(self, slot: int) -> np.ndarray:
        """Positions per column of the request in `slot` (to check the balance)."""
        return self.count[slot].copy()

    def ordered(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 K, V (n, R, nkv, hd_r) of the request in `slot` at positions 0..n-1, as insert took them."""
        m, c = np.nonzero(np.arange(self.cap)[:, None] < self.count[slot][None, :])
        p = self.pos[slot, m, c]
        m, c, p = m[p < n], c[p < n], p[p < n]
        k, v = (np.zeros((n, self.rows, self.nkv, self.hd_r), np.float32) for _ in "kv")
        k[p] = to_f32(self.k[slot, :, :, :, m, c], self.dtype)
        v[p] = to_f32(self.v[slot, c, :, m], self.dtype).transpose(0, 2, 1, 3)
        return k, v

    def positions(self, slot: int) -> list[int]:
        """The token positions the cache of `slot` holds, every column's entries in order."""
        held = np.arange(self.cap)[:, None] < self.count[slot][None, :]
        return sorted(self.pos[slot][held].tolist())


class FlowKVCache:
    """The shift-based cache of :class:`MeshKVCache` on the fast path: the same counts, shifts and bookings,
    the entries kept in position order. Positions flow east oldest first, so a request's n positions lie
    in contiguous runs, the newest at column 0, column c holding n // C + (c < n % C) of them: where every
    entry lies follows from n, and attention (waferrt.decode.shards) reads a request's entries at once.
    Each insert books the shift the mesh would make -- one routing stage of one hop, a message per moving
    core, carrying K, V and the position of one entry per request (what ``MeshKVCache._shift_oldest``
    sends hop by hop) -- so the ledger is the same; tests/unit/test_fast_path.py holds the two to it.
    K and V are (slots, n_kv, positions, rows * hd_r): a new entry is one contiguous row of each."""

    def __init__(self, config: LlamaConfig, comm: LineComm, slots: int, kv_tokens: int, hd_r: int, dtype: str):
        region = comm.region  # comm: the region's x-line (columns), where the shifts are booked
        self.rows, self.cols, self.nkv, self.hd_r = region.h, region.w, config.n_kv_heads, hd_r
        self.dtype, self.comm = dtype, comm
        self.cap = cdiv(kv_tokens, region.w)
        width, store = self.rows * hd_r, storage_dtype(dtype)
        self.k = np.zeros((slots, self.nkv, self.cap * self.cols, width), store)
        self.v = np.zeros((slots, self.nkv, self.cap * self.cols, width), store)
        self.n = np.zeros(slots, np.int64)  # positions each request holds (each column's share: column_counts)
        # by (slot, position) first: an item's entry is written with its two indices side by side (faster)
        self._k_at, self._v_at = self.k.transpose(0, 2, 1, 3), self.v.transpose(0, 2, 1, 3)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.n.nbytes

    def insert(self, slots: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray) -> None:
        """As MeshKVCache.insert: k_new, v_new (B, R, nkv, hd_r) at positions poss of the items' slots."""
        starts = slots[poss == 0]
        if len(starts):
            self.n[starts] = 0
        listed = slots.tolist()
        if len(set(listed)) == len(listed):  # one item per request (a decode step): one shift
            self._shift(slots)
        else:
            rounds = _rounds(slots)
            for r in range(int(rounds.max()) + 1):
                self._shift(slots[rounds == r])
        B = len(slots)
        self._k_at[slots, poss] = to_storage(k_new.transpose(0, 2, 1, 3).reshape(B, self.nkv, -1), self.dtype)
        self._v_at[slots, poss] = to_storage(v_new.transpose(0, 2, 1, 3).reshape(B, self.nkv, -1), self.dtype)

    def _shift(self, S: np.ndarray) -> None:
        """One new entry for each of the (distinct) slots S: count it, and book the shift it makes."""
        n = self.n[S]
        end = n % self.cols  # the first column shorter than column 0 (0: none is)
        if int(n.max()) >= self.cap * self.cols:
            full = n >= self.cap * self.cols
            raise KVCapacityError(f"the K/V cache of this layer is full ({self.cap * self.cols} positions) "
                                  f"for the request in slot {int(S[full][0])}; admission should have refused it")
        span = int(end.max())
        if span:
            with self.comm.ledger.op("kv.shift"):
                nbytes = len(S) * 2 * self.nkv * (self.hd_r + 1) * 4  # per line: K, V, position, as float32
                self.comm.ledger.message(1, nbytes, span * self.comm.lines)
                self.comm.record(np.arange(span), 1, nbytes)
        self.n[S] += 1

    def held_most(self, slots: np.ndarray | slice) -> int:
        return cdiv(int(self.n[slots].max()), self.cols)  # column 0 holds the most (column_counts)

    def read(self, slots: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 K (B, nkv, R*hd_r, length) and V (B, nkv, length, R*hd_r): positions 0..length-1 of the
        items' requests (what a request does not hold yet is masked by the caller)."""
        rows = slots if isinstance(slots, slice) else as_slice(slots)  # a lane's slots are evenly spaced: a view
        return (to_f32(self.k[rows, :, :length], self.dtype).swapaxes(-1, -2),
                to_f32(self.v[rows, :, :length], self.dtype))

    def view(self, items) -> KVView:
        """The items' (waferrt.decode.shards.Items) K/V in position order: K (B, nkv, R*hd_r, L), V (B, nkv, L,
        R*hd_r), hidden (B, 1, 1, L) -- L the longest context -- and the entries the fullest core holds."""
        kc, vc = self.read(items.rows, items.length)
        return KVView(kc, vc, items.hidden, self.held_most(items.rows))

    def reset(self, slot: int) -> None:
        self.n[slot] = 0

    def ordered(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """As MeshKVCache.ordered: float32 K, V (n, R, nkv, hd_r) at positions 0..n-1."""
        k = to_f32(self.k[slot, :, :n], self.dtype).reshape(self.nkv, n, self.rows, self.hd_r)
        v = to_f32(self.v[slot, :, :n], self.dtype).reshape(self.nkv, n, self.rows, self.hd_r)
        return k.transpose(1, 2, 0, 3), v.transpose(1, 2, 0, 3)

    def held(self, slot: int) -> np.ndarray:
        return column_counts(int(self.n[slot]), self.cols)

    def positions(self, slot: int) -> list[int]:
        return list(range(int(self.n[slot])))


def as_slice(slots: np.ndarray) -> slice | np.ndarray:
    """`slots` as a slice when they are evenly spaced and increasing (what indexes the same rows as a view),
    else themselves."""
    s = slots.tolist()
    step = s[1] - s[0] if len(s) > 1 else 1
    if s and step > 0 and all(b - a == step for a, b in zip(s, s[1:])):
        return slice(s[0], s[-1] + 1, step)
    return slots


def _rounds(slots: np.ndarray) -> np.ndarray:
    """The how-many-th item of its request each item is (a prompt's items go in one after another)."""
    listed = slots.tolist()
    if len(set(listed)) == len(listed):  # one item per request (a decode step): one round
        return np.zeros(len(listed), np.int64)
    return np.array([listed[:i].count(s) for i, s in enumerate(listed)], np.int64)
