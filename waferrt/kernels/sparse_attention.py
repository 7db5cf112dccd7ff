"""STAR's sparse attention on the cores: the kept keys of a key block, their products alone, and the
sorted-updating online softmax (issue 22, issue 32).

Contract:
- `Selection(positions, kept, key_block)`: which keys each query attends to after the row's distributed
  top-K (waferrt.decode.sparse_prefill): `positions` (rows, cols, H, mb, K) every (head, query)'s kept key
  positions, best predicted first, -1 for none (the same lists on every core of a row: the top-K's
  multicast left them there); `kept` = min(key_block, K), the most of a query's kept keys one key block
  holds (what a core computes and books a step). `in_block(j)` gives, for the key block j each core holds,
  each query's kept keys in it as places in the block, in predicted order.
- `KeptKeys`: the step products of sparse attention's two MeshGEMMs on the square, over each query's kept keys
  alone, in the *compact* layout: a score or probability block is (rows, cols, H, mb, kept), entry k a query's
  k-th kept key of its key block in predicted order (0 where it keeps fewer). At step t the block a core
  holds -- the score accumulator of the transposed MeshGEMM (waferrt.kernels.gemm_backward.accumulate's
  `kept`) and P's block in P.V (waferrt.kernels.gemm.meshgemm's `kept`) -- is key block (first + t) % side's
  (both move one ring place a step, as K's and V's blocks do), and every core of a row knows that block's kept
  keys (the same lists on every core of a row). ``product`` gathers them from the K block and multiplies:
  the dense Q.K^T is never formed; ``weighted`` gathers their rows of the V block. Only the compact blocks
  move: kept values a query, not the key block's.
- `flash(s, kept, vs=None, block)`: STAR's sorted-updating FlashAttention: the online softmax over scores
  in predicted order, `block` at a time -> `Partial` (running max, sum, and with `vs` the P.V; `rescales`
  counts the (row, block) pairs after the first whose new max forced the rescale: rare in that order).
- `row_statistics(net, comm, part)`: the cores' Partials of a row merged along a line through the Net's
  ``reduce`` (the row's max, each core's rescale to it, the row's sum): how the decode (decode.sparse) and the
  prefill (kernels.attention) both finish the online softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

BLOCK = 16  # keys per step of the sorted-updating softmax (model.sparse.sparse_attention's default)


@dataclass(frozen=True)
class Selection:
    """Each (head, query)'s kept key positions and the most of them a key block holds (module doc)."""

    positions: np.ndarray  # (rows, cols, H, mb, K) int, best predicted first, -1: none
    kept: int
    key_block: int

    def __post_init__(self) -> None:
        if self.positions.ndim != 5 or not 1 <= self.kept <= self.key_block:
            raise ValueError(f"a Selection is (rows, cols, H, mb, K) kept positions and 1 <= kept <= key_block; "
                             f"got {self.positions.shape}, kept {self.kept}, key_block {self.key_block}")

    def in_block(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """j (rows, cols): the key block each core holds -> (places (rows, cols, H, mb, kept) in that block of
        each query's kept keys there, in predicted order (0 where none), which of them are kept keys)."""
        local = self.positions - (j * self.key_block)[:, :, None, None, None]
        inside = (local >= 0) & (local < self.key_block) & (self.positions >= 0)
        order = np.argsort(~inside, axis=-1, kind="stable")[..., :self.kept]  # the block's kept ones, rank order
        inside = np.take_along_axis(inside, order, -1)
        return np.where(inside, np.take_along_axis(local, order, -1), 0), inside

    def mask(self, j: np.ndarray) -> np.ndarray:
        """(rows, cols, H, mb, key_block) bool: the kept keys of the key block j each core holds."""
        places, inside = self.in_block(j)
        out = np.zeros(places.shape[:-1] + (self.key_block + 1,), bool)  # the last place takes the padding
        np.put_along_axis(out, np.where(inside, places, self.key_block), True, axis=-1)
        return out[..., :self.key_block]


@dataclass(frozen=True)
class KeptKeys:
    """Sparse attention's step products over the kept keys, in the compact layout (module doc)."""

    selection: Selection
    first: np.ndarray  # (rows, cols): the key block of each core's A-layout block, the one it holds at step 0
    side: int
    steps: dict = field(default_factory=dict, compare=False, repr=False)  # at()'s answers: both GEMMs ask them

    def at(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Step t's (places (rows, cols, H, mb, kept) in the key block held of each compact entry, which are kept
        keys): Selection.in_block of key block (first + t) % side, worked out once a step for both GEMMs."""
        t %= self.side
        if t not in self.steps:
            self.steps[t] = self.selection.in_block((self.first + t) % self.side)
        return self.steps[t]

    def product(self, t: int, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Step t's partial scores, compact: q (rows, cols, H, mb, db) against each query's kept keys of the K
        block (rows, cols, H, kb, db) -> (rows, cols, H, mb, kept), 0 past a query's kept keys."""
        places, inside = self.at(t)
        ks = np.take_along_axis(k[:, :, :, None], places[..., None], axis=-2)  # (rows, cols, H, mb, kept, db)
        return np.where(inside, kept_dot(q, ks), np.float32(0))

    def weighted(self, t: int, p: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Step t's P.V: the compact probabilities p (rows, cols, H, mb, kept) of the key block held, times their
        keys' rows of the V block (rows, cols, H, kb, db) -> (rows, cols, H, mb, db)."""
        places, _ = self.at(t)
        vs = np.take_along_axis(v[:, :, :, None], places[..., None], axis=-2)  # (rows, cols, H, mb, kept, db)
        return np.matmul(p[..., None, :], vs)[..., 0, :]


def kept_dot(q: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Each query against its own gathered keys: q (..., mb, d), ks (..., mb, w, d) -> (..., mb, w). The only
    place the sparse prefill forms scores from the keys themselves (tests count its elements)."""
    return np.matmul(ks, q[..., None])[..., 0]


class Partial(NamedTuple):
    """One core's (or a joined row's) online softmax over its kept keys: the running max, sum and P.V."""

    top: np.ndarray  # (..., 1)
    total: np.ndarray  # (..., 1)
    acc: np.ndarray | None  # (..., D), None when no values were given
    rescales: int


def flash(s: np.ndarray, kept: np.ndarray, vs: np.ndarray | None = None, block: int = BLOCK) -> Partial:
    """STAR's sorted-updating FlashAttention (``model.sparse.sorted_attention``) over keys in predicted order,
    `block` at a time: s (..., n) scores, kept (..., n) which count, vs (..., n, D) values or None -> the Partial.
    In that order the running max is (nearly always) the first block's, so the rescale a new max forces is rare."""
    top = np.full(s.shape[:-1] + (1,), -np.inf, np.float32)
    total = np.zeros(s.shape[:-1] + (1,), np.float32)
    acc = None if vs is None else np.zeros(s.shape[:-1] + vs.shape[-1:], np.float32)
    rescales = 0
    for lo in range(0, s.shape[-1], block):
        sb = np.where(kept[..., lo:lo + block], s[..., lo:lo + block], np.float32(-np.inf))
        new = np.maximum(top, sb.max(axis=-1, keepdims=True))
        rescales += int(np.count_nonzero(np.isfinite(top) & (new > top)))
        base = np.where(np.isfinite(new), new, np.float32(0))  # a core with no kept key yet stays at zero
        alpha, p = np.exp(top - base), np.exp(sb - base)
        total = total * alpha + p.sum(axis=-1, keepdims=True)
        if acc is not None:
            acc = acc * alpha + np.matmul(p[..., None, :], vs[..., lo:lo + block, :])[..., 0, :]
        top = new
    return Partial(top, total, acc, rescales)


def row_statistics(net, comm, part: Partial) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cores' Partials (top, total (..., 1) each) merged along `comm`'s line of `net`'s cores: (the row's max
    (0 for a row that kept no key: a padding query), the row's sum, each core's rescale exp(its max - the row's),
    0 for a core that kept none) -- the row's max and sum by the Net's ``reduce``."""
    top = net.reduce(comm, part.top, "max")
    top = np.where(np.isfinite(top), top, np.float32(0))
    rescale = np.exp(part.top - top)
    return top, net.reduce(comm, part.total * rescale, "sum"), rescale
