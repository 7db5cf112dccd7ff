"""The K/V caches of one layer region: every request's keys and values stay in the region's cores.

Contract: a :class:`MeshKVCache` holds the K and V of up to ``slots`` requests for one layer, head_dim over
the region's rows and positions over its columns, ``cap`` positions per core, stored in the storage dtype, in
one of two layouts (waferrt.decode.kv_layouts: every core's own entries on the hop-by-hop run, position order
on the fast run; chosen by its x-line's ``fast``, as the layer's Net is). A new position enters at column 0;
when column 0 then holds more than the last column, the columns up to the first shorter one each pass their
oldest entry one hop east over the region's x-line (WaferLLM's shift-based KV cache, "kv.shift"), so every
column's share differs by at most one: a request holding n positions has column_counts(n) of them in its
columns, the newest at column 0. Attention reads them through ``view`` (a KVView in the layout's shapes) and
runs over the entries the fullest core holds (``held_most``). The cache counts every request's positions
(``n``) and refuses one beyond ``cap * cols`` with :class:`KVCapacityError` (admission refuses such requests
before they start). :class:`KVCapacity` is what a cache is sized for; a :class:`PromptChunk` the positions of a
prompt the cache takes at once (the prefill's chunk: decode.prefill), ``kv_columns`` where each position sits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.fabric.comm import LineComm
from waferrt.model.config import LlamaConfig

from .kv_layouts import CoreEntries, KVView, PositionEntries, as_slice, column_counts

__all__ = ["KVCapacity", "KVCapacityError", "KVView", "MeshKVCache", "PromptChunk", "as_slice", "column_counts",
           "kv_columns"]


def kv_columns(tokens: int, cols: int) -> np.ndarray:
    """(tokens,) the column holding each of a request's positions 0..tokens-1 once the cache took them in
    order: positions flow east oldest first, column c holding column_counts of them, the newest at column 0
    (both caches; tests/unit/test_relayout.py reads MeshKVCache's own)."""
    return np.repeat(np.arange(cols), column_counts(tokens, cols))[::-1].copy()  # newest first, read back oldest first


@dataclass(frozen=True)
class KVCapacity:
    """What a layer region's K/V caches are sized for: `slots` requests of `tokens` positions each."""

    slots: int
    tokens: int


@dataclass(frozen=True)
class PromptChunk:
    """A prompt's positions start..start+tokens-1, taken at once (the prefill's chunk; a whole prompt is the
    chunk at 0), the cache holding the `start` positions before them."""

    start: int
    tokens: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.tokens < 1:
            raise ValueError(f"a prompt chunk of {self.tokens} tokens from position {self.start}: give at least "
                             "one token and a start >= 0")

    @property
    def context(self) -> int:
        """The positions the chunk's queries see: those before it and its own."""
        return self.start + self.tokens


class KVCapacityError(MemoryError):
    """A request has more positions than its K/V cache holds."""


class MeshKVCache:
    def __init__(self, config: LlamaConfig, comm: LineComm, size: KVCapacity, hd_r: int, dtype: str):
        region = comm.region  # comm: the region's x-line (columns), for the shifts
        self.rows, self.cols, self.nkv, self.hd_r = region.h, region.w, config.n_kv_heads, hd_r
        self.dtype, self.comm = dtype, comm
        self.cap = cdiv(size.tokens, region.w)
        self.n = np.zeros(size.slots, np.int64)  # positions each request holds
        self.layout = (PositionEntries if comm.fast else CoreEntries)(self, size.slots)

    @property
    def nbytes(self) -> int:
        return self.n.nbytes + self.layout.nbytes

    def insert(self, slots: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray) -> None:
        """One new position for each item: k_new, v_new (B, R, nkv, hd_r). Items of different requests shift
        together; a request's own items (a prompt) go in turn, in position order. An item at position 0
        starts its request afresh: the slot's cache is emptied first (the slot may have held another)."""
        starts = slots[poss == 0]
        if len(starts):
            self.n[starts] = 0
            self.layout.reset(starts)
        listed = slots.tolist()
        if len(set(listed)) == len(listed):  # one item per request (a decode step): one shift
            self._take(slots, k_new, v_new, poss)
            return
        rounds = _rounds(slots)
        for r in range(int(rounds.max()) + 1):
            sel = np.flatnonzero(rounds == r)
            self._take(slots[sel], k_new[sel], v_new[sel], poss[sel])

    def _take(self, S: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, poss: np.ndarray) -> None:
        """A new entry for each of the distinct slots S."""
        n = self.n[S]
        if int(n.max()) >= self.cap * self.cols:
            full = n >= self.cap * self.cols
            raise KVCapacityError(f"the K/V cache of this layer is full ({self.cap * self.cols} positions) "
                                  f"for the request in slot {int(S[full][0])}; admission should have refused it")
        self.layout.take(S, k_new, v_new, poss, n)
        self.n[S] += 1

    def held_most(self, slots: np.ndarray | slice) -> int:
        """The most entries any core holds for these requests (column 0's: column_counts): what attention runs
        over."""
        return cdiv(int(self.n[slots].max()), self.cols)

    def view(self, items, blocks: bool = False) -> KVView:
        """What attention reads for the items (waferrt.decode.shards.Items), in this cache's layout (`blocks`:
        whole position blocks, for the dense attention: kv_layouts)."""
        return self.layout.view(items, blocks)

    def reset(self, slot: int) -> None:
        """Forget the request in `slot` (its positions become free)."""
        self.n[slot] = 0
        self.layout.reset(np.array([slot]))

    def held(self, slot: int) -> np.ndarray:
        """Positions per column of the request in `slot` (to check the balance)."""
        return self.layout.held(slot)

    def ordered(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 K, V (n, R, nkv, hd_r) of the request in `slot` at positions 0..n-1, as insert took them."""
        return self.layout.ordered(slot, n)

    def positions(self, slot: int) -> list[int]:
        """The token positions the cache of `slot` holds, every column's entries in order."""
        return self.layout.positions(slot)


def _rounds(slots: np.ndarray) -> np.ndarray:
    """The how-many-th item of its request each item is (a prompt's items go in one after another)."""
    listed = slots.tolist()
    return np.array([listed[:i].count(s) for i, s in enumerate(listed)], np.int64)
