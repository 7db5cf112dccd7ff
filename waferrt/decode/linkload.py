"""The traffic of every link of a region in one phase of a layer, and what that phase costs.

Contract: a :class:`LinkLoad` holds the bytes that left every core of a region by each of its four sides
(messages routed one hop at a time add to every link on their way) in a phase whose messages travel at once:
its longest route's ``hops``, ``messages``, ``link_bytes`` and ``busiest`` link, a ``core.cost.Phase`` that
``core.cost.alltoall_cost`` prices. :class:`AllToAll` is an MoE layer's dispatch and combine between the
region's column split of a token and its experts' blocks (``block_patterns``: along the rows;
``column_combine``: up and down the columns), what the tiles book as they run (waferrt.decode.moe) and the
closed forms count (waferrt.decode.routed_cost). :class:`PhaseLinks` keeps a layer's link traffic per phase
("attention": the norms, QKV, attention, K/V shift and wo; "moe": the router, dispatch, experts, combine, a
shared expert) as it runs: a tap of its LineComms (waferrt.fabric.comm.LineComm.listen) that adds every booked
message's bytes to the phase under way.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from waferrt.core.cost import Phase
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
    dx = block.x0 - region.x0
    return [(c, j + dx, n) for c, j, n in _splits(dim, region.w, block.w)]


@lru_cache(maxsize=256)
def _splits(dim: int, cols: int, block_cols: int) -> tuple[tuple[int, int, int], ...]:
    """(column of a cols-way split of dim, column of a block_cols-way split, values they share), every pair."""
    owner = {}
    for parts, key in ((cols, "r"), (block_cols, "b")):
        ch = Chunks(dim, parts)
        o = np.empty(dim, np.int64)
        o[ch.index[ch.valid]] = np.nonzero(ch.valid)[0]
        owner[key] = o
    pairs, counts = np.unique(np.stack([owner["r"], owner["b"]]), axis=1, return_counts=True)
    return tuple((int(c), int(j), int(n)) for (c, j), n in zip(pairs.T, counts))


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
    have = np.flatnonzero(rows)
    return column_combines(region, Counter({(int(have[0]), int(have[-1])): 1}), col_bytes)


def column_combines(region: Region, spans: Counter, col_bytes: np.ndarray) -> LinkLoad:
    """column_combine of many tokens at once: `spans` counts the tokens whose contributions lie from row top to
    row bottom ((top, bottom) -> tokens; only the ends matter). A link south of row y carries the partial sums
    of the tokens with top <= y (y < R - 1), north of row y of those with bottom >= y (y > 0)."""
    load = LinkLoad(region)
    south, north, messages, load.hops = _span_sums(region.h, spans)
    load.messages = int(np.count_nonzero(col_bytes)) * messages
    load.bytes[S] = south[:, None] * col_bytes[None]
    load.bytes[N] = north[:, None] * col_bytes[None]
    return load


def _span_sums(h: int, spans: Counter) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(south, north, messages, hops) of column_combines on one column of h rows: the tokens whose partial
    sums each link south (north) of a row carries, the messages and the longest route."""
    south, north, messages, hops = np.zeros(h), np.zeros(h), 0, 0
    for (top, bottom), tokens in spans.items():
        south[top:h - 1] += tokens
        north[1:bottom + 1] += tokens
        messages += tokens * (max(h - 1 - top, 0) + bottom)
        hops = max(hops, h - 1 - top, bottom)
    return south, north, messages, hops


class AllToAll:
    """The all-to-all of a region's expert blocks: one token's dispatch and row-combine LinkLoads per block,
    and the column combine of the rows its experts' blocks cover (``of``: one per region and blocks, so its
    routes are worked out once)."""

    def __init__(self, dim: int, region: Region, blocks: tuple[Region, ...]):
        self.region, self.blocks, self.dim = region, blocks, dim
        self.index = {b: i for i, b in enumerate(dict.fromkeys(blocks))}  # each block once, in expert order
        self.numbers = [self.index[b] for b in blocks]  # each expert's block's number
        self.tops = [b.y0 - region.y0 for b in self.index]  # each numbered block's first and last row
        self.bottoms = [b.y0 - region.y0 + b.h - 1 for b in self.index]
        self.sets: dict[tuple[int, ...], tuple[LinkLoad, LinkLoad]] = {}  # made when a token first goes there
        self.strips: dict[Region, tuple[LinkLoad, LinkLoad]] = {}  # phases' routes of each block, on its rows
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
        for chosen, tokens in self._sets(experts).items():
            there, back = self._one_token(chosen)
            dispatch.add(there, tokens)
            combine.add(back, tokens)
        return dispatch, combine

    def phases(self, experts: np.ndarray) -> tuple[Phase, Phase]:
        """(dispatch, combine) of the tokens that chose `experts` (T, k) as what alltoall_cost prices of
        ``loads(experts)`` (the longest route, the messages, the bytes over all links, the busiest link's), worked
        out without the region's arrays: a block's routes are the same on each of its rows (``_strip``), so the
        links along a band of rows carry the sum of the blocks covering it, each times the tokens that go there;
        the column combines' links carry a column's partial sum times the tokens behind them
        (``column_combines``). For samples of many distinct sets on large regions (decode.routed_cost's
        expected routing)."""
        order, sets, used = list(self.index), self._sets(experts), Counter()
        for chosen, tokens in sets.items():
            used.update(dict.fromkeys(chosen, tokens))
        used = sorted(used.items())
        cuts = sorted({y for i, _ in used for y in (order[i].y0, order[i].y1)})
        out = []
        for which in (0, 1):  # dispatch, then combine's rows
            strips = [(order[i], self._strip(order[i])[which], n) for i, n in used]
            bands = [sum(n * load.bytes[:, 0] for b, load, n in strips if b.y0 <= y0 < b.y1)
                     for y0 in cuts[:-1]]
            out.append([max((b.max() for b in bands if np.ndim(b)), default=0.0),
                        sum(n * load.total() for _, load, n in strips), sum(n * load.messages for _, load, n in strips),
                        max((load.hops for _, load, _ in strips), default=0)])
        spans = Counter()
        for chosen, tokens in sets.items():
            spans[self._span(chosen)] += tokens
        south, north, messages, hops = _span_sums(self.region.h, spans)  # one column's
        busiest = max(south.max(), north.max()) * float(self.col_bytes.max())
        combine = [max(out[1][0], busiest), out[1][1] + (south.sum() + north.sum()) * float(self.col_bytes.sum()),
                   out[1][2] + messages * int(np.count_nonzero(self.col_bytes)), max(out[1][3], hops)]
        return tuple(Phase(hops, messages, int(round(total)), busy)
                     for busy, total, messages, hops in (out[0], combine))

    def _sets(self, experts: np.ndarray) -> Counter:
        """How many of the tokens that chose `experts` (T, k) go to each set of blocks (their numbers, sorted;
        in the order the tokens first name them)."""
        numbers = self.numbers
        return Counter(tuple(sorted({numbers[e] for e in chosen})) for chosen in np.asarray(experts).tolist())

    def _strip(self, block: Region) -> tuple[LinkLoad, LinkLoad]:
        """block_patterns of `block` on the strip of the region its rows make (all its routes hold), kept."""
        if block not in self.strips:
            strip = Region(self.region.x0, block.y0, self.region.w, block.h)
            self.strips[block] = block_patterns(self.dim, strip, block)
        return self.strips[block]

    def _span(self, chosen) -> tuple[int, int]:
        """(top, bottom): the first and last of the region's rows the blocks numbered `chosen` cover."""
        return min(self.tops[i] for i in chosen), max(self.bottoms[i] for i in chosen)

    def _rows(self, chosen) -> np.ndarray:
        """(R,) bool: the region's rows the blocks numbered `chosen` cover."""
        rows, order = np.zeros(self.region.h, bool), list(self.index)
        for block in (order[i] for i in chosen):
            rows[block.y0 - self.region.y0: block.y0 - self.region.y0 + block.h] = True
        return rows

    def _one_token(self, chosen: tuple[int, ...]) -> tuple[LinkLoad, LinkLoad]:
        """(dispatch, combine) of one token to the blocks numbered `chosen` (self.index's numbers)."""
        if chosen not in self.sets:
            dispatch, combine, order = LinkLoad(self.region), LinkLoad(self.region), list(self.index)
            for block in (order[i] for i in chosen):
                there, back = block_patterns(self.dim, self.region, block)
                dispatch.add(there)
                combine.add(back)
            combine.add(column_combine(self.region, self._rows(chosen), self.col_bytes))
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
