"""The two layouts of a layer region's K/V cache (waferrt.decode.kvcache.MeshKVCache), one per implementation of
the layer's collectives (waferrt.decode.net).

Contract: a layout stores the entries of the cache it belongs to (``cache``: its dims, its dtype, its x-line
``comm``, and ``n``, the positions each request holds) and answers for them: ``take(S, k, v, poss, n)`` one new
entry for each of the distinct slots S (holding n positions before), shifting what the shift-based cache shifts;
``view(items, blocks)`` what attention reads (a KVView, its split axes as the run's Net holds them; with
``blocks``, PositionEntries reads whole decode.net.POSITION_BLOCKs, the positions past the cache's end as zeros,
masked: what makes an item's attention the same whatever context the items beside it hold); ``reset``,
``held``, ``positions``, ``ordered``, ``read`` and ``nbytes``.

- :class:`CoreEntries` (the hop-by-hop run): every core's own entries, K as (slots, rows, n_kv, hd_r, cap,
  cols), V as (slots, cols, n_kv, cap, rows, hd_r), each column's entries oldest first from place 0
  (``count``) with their token positions (``pos``); the columns up to the first shorter one pass their oldest
  entry one hop east over the x-line, K, V and position in one message per core (``LineComm.transfer``).
- :class:`PositionEntries` (the fast run): the same entries in position order, K and V (slots, n_kv,
  positions, rows * hd_r), so a request's entries are read at once; where each lies follows from n
  (kvcache.column_counts). Each take records the shift the mesh makes -- one routing stage of one hop, a
  message per moving core carrying one entry per request -- so the ledger is the hop-by-hop one
  (tests/unit/test_fast_path.py holds the two to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.dtypes import storage_dtype, to_f32, to_storage

from .net import whole_blocks


def column_counts(tokens: int, cols: int) -> np.ndarray:
    """(cols,) how many of a request's `tokens` positions each column holds once the cache took them in order:
    tokens // cols + (c < tokens % cols) at column c (every column's share differs by at most one)."""
    return tokens // cols + (np.arange(cols) < tokens % cols)


def as_slice(slots: np.ndarray) -> slice | np.ndarray:
    """`slots` as a slice when they are evenly spaced and increasing (what indexes the same rows as a view),
    else themselves."""
    s = slots.tolist()
    step = s[1] - s[0] if len(s) > 1 else 1
    if s and step > 0 and all(b - a == step for a, b in zip(s, s[1:])):
        return slice(s[0], s[-1] + 1, step)
    return slots


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


@dataclass(frozen=True, eq=False)
class HeldEntries:
    """What every core of a region holds of the items' requests (CoreEntries.held_entries): K (B, R, nkv, hd_r,
    m*C) and V (B, C, nkv, m, R*hd_r) of each core's first m entries, place-major, and `visible` (B, m, C): the
    entries each item may attend to."""

    k: np.ndarray
    v: np.ndarray
    visible: np.ndarray


class CoreEntries:
    def __init__(self, cache, slots: int):
        c, store = cache, storage_dtype(cache.dtype)
        self.cache = cache
        # K as (.., hd_r, cap, C): one core's dims against every cached position is a single matmul, and
        # the first m places of every core are one contiguous run
        self.k = np.zeros((slots, c.rows, c.nkv, c.hd_r, c.cap, c.cols), store)
        # V as (C, nkv, cap, R, hd_r): a column's weights times its cached values is one matmul per head
        self.v = np.zeros((slots, c.cols, c.nkv, c.cap, c.rows, c.hd_r), store)
        self.pos = np.zeros((slots, c.cap, c.cols), np.int64)  # token position of each entry
        self.count = np.zeros((slots, c.cols), np.int64)  # entries each column holds, from place 0 on

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes + self.count.nbytes

    def reset(self, slots: np.ndarray) -> None:
        self.count[slots] = 0

    def take(self, S: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray, n: np.ndarray) -> None:
        """k_new, v_new (n, R, nkv, hd_r) enter column 0 of the distinct slots S; the columns before the first
        shorter one pass their oldest east first."""
        c, count = self.cache, self.count[S]  # (n, C) a copy
        less = count < count[:, :1]
        end = np.where(less.any(axis=1), less.argmax(axis=1), 0)  # (n,) first column shorter than column 0
        cols = np.arange(c.cols)
        moving = cols[None, :] < end[:, None]  # (n, C): these columns pass their oldest entry east
        incoming = cols[None, :] <= end[:, None]  # (n, C): these columns take an entry
        ki, vi, pi = k_new[:, None], v_new[:, None], poss[:, None]  # what column 0 takes
        if moving.any():
            got_k, got_v, got_p = self._shift_oldest(S, moving, int(end.max()), int(count[moving].max()))
            ki, vi = np.concatenate([ki, got_k], axis=1), np.concatenate([vi, got_v], axis=1)
            pi = np.concatenate([pi, got_p], axis=1)
        b, col = np.nonzero(incoming)
        tail = count[b, col] - moving[b, col]  # the newest entry goes last (a moving column lost its oldest)
        self.k[S[b], :, :, :, tail, col] = to_storage(ki[b, col], c.dtype)
        self.v[S[b], col, :, tail] = to_storage(vi[b, col].transpose(0, 2, 1, 3), c.dtype)
        self.pos[S[b], tail, col] = pi[b, col]
        self.count[S, end] += 1

    def _shift_oldest(self, S, moving, span: int, held: int):
        """The moving columns send their oldest entry (K, V and its position, one message per core) one hop
        east and move the rest (at most `held` entries) down one place. Returns what columns 1..span
        received: K, V (n, span, R, nkv, hd_r), positions (n, span)."""
        c = self.cache
        b, col = np.nonzero(moving)
        send = np.zeros((c.cols, len(S), c.rows, 2, c.nkv, c.hd_r + 1), np.float32)
        send[col, b, :, 0, :, :-1] = to_f32(self.k[S[b], :, :, :, 0, col], c.dtype)
        v_out = to_f32(self.v[S[b], col, :, 0], c.dtype)  # (pairs, nkv, R, hd_r)
        send[col, b, :, 1, :, :-1] = v_out.transpose(0, 2, 1, 3)
        send[col, b, :, 0, 0, -1] = self.pos[S[b], 0, col][:, None]
        self.k[S[b], :, :, :, :held - 1, col] = self.k[S[b], :, :, :, 1:held, col]  # oldest first, from place 0
        self.v[S[b], col, :, :held - 1] = self.v[S[b], col, :, 1:held]
        self.pos[S[b], :held - 1, col] = self.pos[S[b], 1:held, col]
        with c.comm.ledger.op("kv.shift"):
            _, got = c.comm.transfer(send, np.arange(span), 1, array_axis=0)
        got = got.swapaxes(0, 1)  # (n, span, R, 2, nkv, hd_r + 1)
        return got[:, :, :, 0, :, :-1], got[:, :, :, 1, :, :-1], got[:, :, 0, 0, 0, -1].astype(np.int64)

    def read(self, slots: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 K (B, R, nkv, hd_r, m*C) and V (B, C, nkv, m, R*hd_r) of the items' requests: every
        core's first m entries (its oldest; a core holds its entries from place 0 on), place-major."""
        c, B = self.cache, len(slots)
        k = to_f32(self.k[slots, :, :, :, :m], c.dtype).reshape(B, c.rows, c.nkv, c.hd_r, -1)
        return k, to_f32(self.v[slots, :, :, :m], c.dtype).reshape(B, c.cols, c.nkv, m, -1)

    def visible(self, slots: np.ndarray, poss: np.ndarray, m: int) -> np.ndarray:
        """(B, m, C): the entries item b may attend to -- held by its request, at positions <= poss[b]."""
        held = np.arange(m)[:, None] < self.count[slots][:, None, :]
        return held & (self.pos[slots, :m] <= poss[:, None, None])

    def held_entries(self, items, m: int) -> HeldEntries:
        """The items' (shards.Items) K/V as every core holds it, over each core's first m entries (read), and
        which of them each item may attend to (visible)."""
        return HeldEntries(*self.read(items.slots, m), self.visible(items.slots, items.poss, m))

    def view(self, items, blocks: bool = False) -> KVView:
        """The items' K/V as every core holds it: K (B, nkv, R, hd_r, C, m), V (B, nkv, C, m, R*hd_r), hidden
        (B, 1, 1, C, m), over the m entries the fullest core holds (`blocks`: the fast run's alone)."""
        c, m = self.cache, self.cache.held_most(items.slots)
        kc, vc = self.read(items.slots, m)
        k = kc.reshape(len(items.slots), c.rows, c.nkv, c.hd_r, m, c.cols).transpose(0, 2, 1, 3, 5, 4)
        hidden = ~self.visible(items.slots, items.poss, m).transpose(0, 2, 1)[:, None, None]
        return KVView(k, vc.transpose(0, 2, 1, 3, 4), hidden, m)

    def held(self, slot: int) -> np.ndarray:
        return self.count[slot].copy()

    def ordered(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        c = self.cache
        m, col = np.nonzero(np.arange(c.cap)[:, None] < self.count[slot][None, :])
        p = self.pos[slot, m, col]
        m, col, p = m[p < n], col[p < n], p[p < n]
        k, v = (np.zeros((n, c.rows, c.nkv, c.hd_r), np.float32) for _ in "kv")
        k[p] = to_f32(self.k[slot, :, :, :, m, col], c.dtype)
        v[p] = to_f32(self.v[slot, col, :, m], c.dtype).transpose(0, 2, 1, 3)
        return k, v

    def positions(self, slot: int) -> list[int]:
        held = np.arange(self.cache.cap)[:, None] < self.count[slot][None, :]
        return sorted(self.pos[slot][held].tolist())


class PositionEntries:
    def __init__(self, cache, slots: int):
        c = self.cache = cache
        width, store = c.rows * c.hd_r, storage_dtype(c.dtype)
        self.k = np.zeros((slots, c.nkv, c.cap * c.cols, width), store)
        self.v = np.zeros((slots, c.nkv, c.cap * c.cols, width), store)
        # by (slot, position) first: an item's entry is written with its two indices side by side (faster)
        self.k_at, self.v_at = self.k.transpose(0, 2, 1, 3), self.v.transpose(0, 2, 1, 3)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def reset(self, slots: np.ndarray) -> None:
        """Nothing to forget: where the entries lie follows from the cache's n."""

    def take(self, S: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray, n: np.ndarray) -> None:
        """Record the shift the new entries make, and write them at their positions."""
        c = self.cache
        span = int((n % c.cols).max())  # the first column shorter than column 0 (0: none is)
        if span:
            with c.comm.ledger.op("kv.shift"):
                nbytes = len(S) * 2 * c.nkv * (c.hd_r + 1) * 4  # per line: K, V, position, as float32
                c.comm.ledger.message(1, nbytes, span * c.comm.lines)
                c.comm.record(np.arange(span), 1, nbytes)
        B = len(S)
        self.k_at[S, poss] = to_storage(k_new.transpose(0, 2, 1, 3).reshape(B, c.nkv, -1), c.dtype)
        self.v_at[S, poss] = to_storage(v_new.transpose(0, 2, 1, 3).reshape(B, c.nkv, -1), c.dtype)

    def read(self, slots: np.ndarray | slice, length: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 K (B, nkv, R*hd_r, length) and V (B, nkv, length, R*hd_r): positions 0..length-1 of the
        items' requests (what a request does not hold yet is masked by the caller)."""
        dtype, slots = self.cache.dtype, slots if isinstance(slots, slice) else as_slice(slots)  # a lane's: a view
        return to_f32(self.k[slots, :, :length], dtype).swapaxes(-1, -2), to_f32(self.v[slots, :, :length], dtype)

    def view(self, items, blocks: bool = False) -> KVView:
        """The items' K/V in position order: K (B, nkv, R*hd_r, L), V (B, nkv, L, R*hd_r), hidden (B, 1, 1, L)
        -- L the longest context, with `blocks` rounded up to whole POSITION_BLOCKs (zeros past the cache's
        end) -- and the entries the fullest core holds."""
        length = whole_blocks(items.length) if blocks else items.length
        kc, vc = self.read(items.rows, length)
        if (short := length - kc.shape[-1]) > 0:
            kc = np.concatenate([kc, np.zeros((*kc.shape[:-1], short), kc.dtype)], axis=-1)
            vc = np.concatenate([vc, np.zeros((*vc.shape[:-2], short, vc.shape[-1]), vc.dtype)], axis=-2)
        hidden = items.hidden
        if length != items.length:
            hidden = (np.arange(length)[None] > items.poss[:, None])[:, None, None]
        return KVView(kc, vc, hidden, self.cache.held_most(items.rows))

    def held(self, slot: int) -> np.ndarray:
        return column_counts(int(self.cache.n[slot]), self.cache.cols)

    def ordered(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        c = self.cache
        k = to_f32(self.k[slot, :, :n], c.dtype).reshape(c.nkv, n, c.rows, c.hd_r)
        v = to_f32(self.v[slot, :, :n], c.dtype).reshape(c.nkv, n, c.rows, c.hd_r)
        return k.transpose(1, 2, 0, 3), v.transpose(1, 2, 0, 3)

    def positions(self, slot: int) -> list[int]:
        return list(range(int(self.cache.n[slot])))
