"""The traffic of every link of a region in one phase of a layer, and what that phase costs.

Contract: a :class:`LinkLoad` holds the bytes that left every core of a region by each of its four sides
(messages routed one hop at a time add to every link on their way) in a phase whose messages travel at once:
its longest route's ``hops``, ``messages``, ``link_bytes`` and ``busiest`` link, a ``core.cost.Phase`` that
``core.cost.alltoall_cost`` prices. :class:`AllToAll` is an MoE layer's dispatch and combine between the
region's column split of a token and its experts' blocks (``block_patterns``: along the rows;
``column_combine``: up and down the columns), what the tiles book as they run (waferrt.decode.moe) and the
closed forms count (waferrt.decode.cost). :class:`PhaseLinks` keeps a layer's link traffic per phase
("attention": the norms, QKV, attention, K/V shift and wo; "moe": the router, dispatch, experts, combine, a
shared expert) as it runs: a tap of its LineComms (waferrt.fabric.comm.LineComm.listen) that adds every booked
message's bytes to the phase under way.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from waferrt.core.layout import Chunks
from waferrt.core.mesh import Region

E, W, S, N = range(4)  # the side a link leaves its core by (LinkLoad.bytes' first axis)
SIDES = "EWSN"


class LinkLoad:
    """Bytes over every directed link of a region: ``bytes[side, y, x]`` is what left core (x, y) (region
    coordinates) by `side`; ``messages`` the messages sent; ``hops`` the longest route's hops."""

    def __init__(self, region: Region):
        self.region = region
        self.bytes = np.zeros((4, region.h, region.w))
        self.messages, self.hops = 0, 0

    def along_row(self, y: int, x0: int, x1: int, nbytes: float) -> None:
        """A message of `nbytes` from (x0, y) to (x1, y), one hop at a time."""
        if x1 > x0:
            self.bytes[E, y, x0:x1] += nbytes
        elif x1 < x0:
            self.bytes[W, y, x1 + 1:x0 + 1] += nbytes
        self.messages += x0 != x1
        self.hops = max(self.hops, abs(x1 - x0))

    def along_column(self, x: int, y0: int, y1: int, nbytes: float) -> None:
        """A message of `nbytes` from (x, y0) to (x, y1), one hop at a time."""
        if y1 > y0:
            self.bytes[S, y0:y1, x] += nbytes
        elif y1 < y0:
            self.bytes[N, y1 + 1:y0 + 1, x] += nbytes
        self.messages += y0 != y1
        self.hops = max(self.hops, abs(y1 - y0))

    def on_lines(self, axis: str, lines: Region, lower: np.ndarray, higher: np.ndarray) -> None:
        """Bytes on each link of every line along `axis` ("x": rows, "y": columns) of `lines` (a part of the
        region): `lower`, `higher` (n,) toward lower / higher positions, by the core the link leaves."""
        x, y = slice(lines.x0 - self.region.x0, lines.x0 - self.region.x0 + lines.w), \
            slice(lines.y0 - self.region.y0, lines.y0 - self.region.y0 + lines.h)
        if axis == "x":
            self.bytes[W, y, x] += lower[None]
            self.bytes[E, y, x] += higher[None]
        else:
            self.bytes[N, y, x] += lower[:, None]
            self.bytes[S, y, x] += higher[:, None]

    def add(self, other: LinkLoad, times: int = 1) -> None:
        if times:
            self.bytes += other.bytes if times == 1 else times * other.bytes
            self.messages += times * other.messages
            self.hops = max(self.hops, other.hops)

    def links(self) -> np.ndarray:
        """The bytes of every link that exists: a mesh region's edge cores have no link out of it, but a torus's
        wrap link leaves from one (fabric.line_links), counted when it carried bytes."""
        b = self.bytes
        wraps = ([b[E, :, -1], b[W, :, 0]] if self.region.w > 2 else []) + (
            [b[S, -1], b[N, 0]] if self.region.h > 2 else [])  # a torus line of 2 has no wrap
        return np.concatenate([b[E, :, :-1].ravel(), b[W, :, 1:].ravel(), b[S, :-1].ravel(), b[N, 1:].ravel()]
                              + [w[w > 0] for w in wraps])

    def hottest(self) -> float:
        return float(self.links().max(initial=0.0))

    def cold_share(self) -> float:
        """The share of the region's links that carried nothing."""
        links = self.links()
        return float(np.mean(links == 0)) if links.size else 1.0

    def total(self) -> float:
        return float(self.bytes.sum())

    @property
    def link_bytes(self) -> int:  # a core.cost.Phase: what alltoall_cost prices
        return int(round(self.total()))

    @property
    def busiest(self) -> float:
        return self.hottest()


def _pieces(dim: int, region: Region, block: Region) -> list[tuple[int, int, int]]:
    """(region column, block column, values) of every piece of a token that moves from the region's column
    split of dim to the block's (both relative to the region)."""
    owner = {}
    for parts, key in ((region.w, "r"), (block.w, "b")):
        ch = Chunks(dim, parts)
        o = np.empty(dim, np.int64)
        o[ch.index[ch.valid]] = np.nonzero(ch.valid)[0]
        owner[key] = o
    pairs, counts = np.unique(np.stack([owner["r"], owner["b"]]), axis=1, return_counts=True)
    dx = block.x0 - region.x0
    return [(int(c), int(j) + dx, int(n)) for (c, j), n in zip(pairs.T, counts)]


def block_patterns(dim: int, region: Region, block: Region) -> tuple[LinkLoad, LinkLoad]:
    """(dispatch, combine along the rows) of one token to and from `block`: every block row moves the
    pieces between the region's column split and the block's."""
    dispatch, back, top = LinkLoad(region), LinkLoad(region), block.y0 - region.y0
    for c, x, n in _pieces(dim, region, block):  # the block's first row, then the same on every other
        dispatch.along_row(top, c, x, 4 * n)
        back.along_row(top, x, c, 4 * n)
    for load in (dispatch, back):
        load.bytes[:, top:top + block.h] = load.bytes[:, top:top + 1]
        load.messages *= block.h
    return dispatch, back


def column_combine(region: Region, rows: np.ndarray, col_bytes: np.ndarray) -> LinkLoad:
    """The sum of contributions held in `rows` (bool (R,)) of every column reaching every row: a link
    carries the column's partial sum (`col_bytes` (C,)) when a contribution lies behind it."""
    load = LinkLoad(region)
    have = np.flatnonzero(rows)
    top, bottom = int(have[0]), int(have[-1])
    ys = np.arange(region.h)
    load.bytes[S] = (ys >= top)[:, None] * (ys < region.h - 1)[:, None] * col_bytes[None]
    load.bytes[N] = (ys <= bottom)[:, None] * (ys > 0)[:, None] * col_bytes[None]
    load.messages = int(np.count_nonzero(load.bytes))
    load.hops = max(region.h - 1 - top, bottom)
    return load


class AllToAll:
    """The all-to-all of a region's expert blocks: one token's dispatch and row-combine LinkLoads per block,
    and the column combine of the rows its experts' blocks cover (``of``: one per region and blocks, so its
    routes are worked out once)."""

    def __init__(self, dim: int, region: Region, blocks: tuple[Region, ...]):
        self.region, self.blocks, self.dim = region, blocks, dim
        self.index = {b: i for i, b in enumerate(dict.fromkeys(blocks))}  # each block once, in expert order
        self.sets: dict[tuple[int, ...], tuple[LinkLoad, LinkLoad]] = {}  # made when a token first goes there
        self.col_bytes = 4.0 * Chunks(dim, region.w).valid.sum(axis=1)  # (C,) the token's piece in each column

    @staticmethod
    @lru_cache(maxsize=4)  # a few regions' routes (a LinkLoad of a large region is megabytes)
    def of(dim: int, region: Region, blocks: tuple[Region, ...]) -> AllToAll:
        return AllToAll(dim, region, blocks)

    def loads(self, experts: np.ndarray) -> tuple[LinkLoad, LinkLoad]:
        """(dispatch, combine) of tokens that chose `experts` (T, k): each token goes once to each block
        holding one of its experts. Tokens whose experts lie in the same blocks send the same messages, so
        each set of blocks is routed once and added as many times as tokens chose it (a batch of 32,768
        tokens costs what its few distinct sets cost)."""
        dispatch, combine = LinkLoad(self.region), LinkLoad(self.region)
        sets = Counter(tuple(sorted({self.index[self.blocks[e]] for e in chosen}))
                       for chosen in np.asarray(experts).tolist())
        for chosen, tokens in sets.items():
            there, back = self._one_token(chosen)
            dispatch.add(there, tokens)
            combine.add(back, tokens)
        return dispatch, combine

    def _one_token(self, chosen: tuple[int, ...]) -> tuple[LinkLoad, LinkLoad]:
        """(dispatch, combine) of one token to the blocks numbered `chosen` (self.index's numbers)."""
        if chosen not in self.sets:
            dispatch, combine, rows = LinkLoad(self.region), LinkLoad(self.region), np.zeros(self.region.h, bool)
            order = list(self.index)
            for block in (order[i] for i in chosen):
                there, back = block_patterns(self.dim, self.region, block)
                dispatch.add(there)
                combine.add(back)
                rows[block.y0 - self.region.y0: block.y0 - self.region.y0 + block.h] = True
            combine.add(column_combine(self.region, rows, self.col_bytes))
            self.sets[chosen] = dispatch, combine
        return self.sets[chosen]


PHASES = ("attention", "moe")


class PhaseLinks:
    """Every link's bytes per phase of a layer (``loads``), as its LineComms book them (module docstring);
    ``phase`` is the phase under way."""

    def __init__(self, region: Region):
        self.region, self.phase = region, "attention"
        self.loads = {p: LinkLoad(region) for p in PHASES}

    def __call__(self, comm, lower: np.ndarray, higher: np.ndarray) -> None:
        self.loads[self.phase].on_lines(comm.axis, comm.region, lower, higher)

    def mark(self) -> dict[str, np.ndarray]:
        """The bytes so far, to take what a run adds (``since``)."""
        return {p: load.bytes.copy() for p, load in self.loads.items()}

    def since(self, mark: dict[str, np.ndarray]) -> dict[str, LinkLoad]:
        """Each phase's traffic since `mark`."""
        out = {}
        for p, load in self.loads.items():
            out[p] = LinkLoad(self.region)
            out[p].bytes = load.bytes - mark[p]
        return out
