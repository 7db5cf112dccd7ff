"""The moves between the decode's layout and the prefill's, routed hop by hop and booked per link.

Contract: a move sends, for each of its parts (a weight matrix; a chunk's new K/V; the cached entries
moving), one message per (source core, destination core) pair of a region carrying every value of the
part that pair exchanges; it goes one hop at a time along its source's row to the destination's column,
then along that column (dimension-ordered routing), and adds its bytes to every link on its way (a
:class:`~waferrt.decode.linkload.LinkLoad`). A move's messages travel at once: ``alltoall_cost`` (the longest
route's hops, then the busiest link's bytes one after the other). :func:`route` routes messages one by
one; the closed forms below get the same LinkLoad without listing the pairs: each part's values are every
pair of a group of row indices and a group of column indices, so every link's bytes are products of the
two sides' sums (``_cross``), the messages the pairs of groups that move, the longest route the farthest
pair of extremes.

The prefill makes four moves (waferrt.decode.prefill; their values carried by waferrt.decode.transport), each a
closed form here:
``weights_load``: a layer's weights from the decode's blocks (decode.layout: dim over the columns, head_dim
in whole RoPE pairs over a head group's rows, hidden over the rows) into the B blocks of its four MeshGEMMs
on the square at the region's corner (k in panels, n in column blocks, core (i, j) holding panel (i + j) %
s, on MeshGEMM's interleaved rings: waferrt.kernels.gemm.place), and back the same way reversed;
``kv_load``: a chunk's K and V from the QKV product's C blocks (token block i, column block j at ring place
(i, j)) into the decode's cache (head_dim's rows, the column ``kvcache.kv_columns`` gives each position),
and the positions already cached moving east along their rows to where the longer prompt leaves them;
``kv_read_load``: for a chunk after the first, the cached positions' K and V into the attention's blocks
(token block p // mb, head_dim block d // db); ``heads_load``: the QKV product's Q, K and V columns into the
attention's per-head blocks. Norms and the replicated residual stream do not move.
tests/unit/test_relayout.py routes every value from the homes the emulator gives it (kernels.gemm.place and
spread, the cache's own columns) and holds the LinkLoads equal to these, link for link.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, alltoall_cost
from waferrt.core.layout import chunk_bounds
from waferrt.core.mesh import Region
from waferrt.kernels.gemm import ring
from waferrt.model.config import LlamaConfig

from .kvcache import PromptChunk, kv_columns
from .linkload import E, LinkLoad, N, S, W


def route(region: Region, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> LinkLoad:
    """Messages from cores `src` (n, 2: y, x from the region's corner) to `dst` (n, 2) of `nbytes` (n,): the
    values of one pair travel as one message, along the source's row, then the destination's column."""
    h, w = region.h, region.w
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    b = np.asarray(nbytes, np.float64)
    go = np.any(src != dst, axis=1) & (b > 0)
    (y0, x0), (y1, x1), b = src[go].T, dst[go].T, b[go]
    load = LinkLoad(region)
    load.bytes[E], load.bytes[W] = _legs(Legs(line=y0, start=x0, end=x1, nbytes=b), h, w)  # along the source's row
    south, north = _legs(Legs(line=x1, start=y0, end=y1, nbytes=b), w, h)  # along the destination's column
    load.bytes[S], load.bytes[N] = south.T, north.T
    load.messages = len(np.unique((y0 * w + x0) * (h * w) + y1 * w + x1))  # a pair's values go together
    load.hops = int((np.abs(x1 - x0) + np.abs(y1 - y0)).max(initial=0))
    return load


@dataclass(frozen=True, eq=False)
class Legs:
    """Messages' legs along the lines of a grid (its rows, or its columns): leg i runs on line `line[i]` from
    place `start[i]` to place `end[i]` carrying `nbytes[i]` (arrays of one length)."""

    line: np.ndarray
    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray


def _legs(legs: Legs, lines: int, places: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes (lines, places) over the links of a grid of `lines` lines of `places` places that `legs` leave
    by: (toward higher places: start..end-1, toward lower: end+1..start), summed as differences along each
    line."""
    line, a, z, b = legs.line, legs.start, legs.end, legs.nbytes
    n, m = lines, places + 1

    def along(lo: np.ndarray, hi: np.ndarray, sel: np.ndarray) -> np.ndarray:
        at = np.concatenate([line[sel] * m + lo[sel], line[sel] * m + hi[sel]])
        diff = np.bincount(at, np.concatenate([b[sel], -b[sel]]), n * m).reshape(n, m)
        return np.cumsum(diff, axis=1)[:, :-1]

    return along(a, z, z > a), along(z + 1, a + 1, z < a)


def move_cost(spec, load: LinkLoad) -> Cost:
    """A move's messages at once (linkload.alltoall_cost)."""
    return alltoall_cost(spec, load)


# -- where values sit ------------------------------------------------------------------------------------
def _owner(n: int, parts: int, granule: int = 1) -> np.ndarray:
    """(n,) the chunk (core along a line) holding each index of an axis cut as decode.layout cuts it."""
    return np.searchsorted(chunk_bounds(n, parts, granule), np.arange(n), side="right") - 1


def head_rows(heads: int, head_dim: int, rows: int, groups: int = 1) -> np.ndarray:
    """(heads * head_dim,) the row holding each (head, dim) of a head-split output (decode.layout; with
    head groups (decode.cost.layer_dims) head h's head_dim is cut over group h // (heads / groups)'s rows)."""
    r = rows // groups
    group = np.arange(heads) // (heads // groups)
    return (group[:, None] * r + _owner(head_dim, r, 2)[None, :]).ravel()


def _groups(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of the stacked `keys` (k, m) and how many indices share each."""
    return np.unique(np.stack(keys), axis=1, return_counts=True)


def _hist(shape: tuple[int, ...], keys: tuple, counts: np.ndarray) -> np.ndarray:
    """counts summed into an array of `shape` at `keys` (one index array per axis)."""
    return np.bincount(np.ravel_multi_index(keys, shape), counts, int(np.prod(shape))).reshape(shape)


def _cross(lines_to: np.ndarray, frm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Link bytes (lines, places) of legs whose line and end come from one side (lines_to (lines, places):
    bytes by line and end) and whose start from the other (frm (places,): share by start), every pair
    of the two: (toward higher places, toward lower)."""
    higher = np.cumsum(frm)[None, :] * (lines_to.sum(axis=1, keepdims=True) - np.cumsum(lines_to, axis=1))
    lower = np.cumsum(frm[::-1])[::-1][None, :] * (np.cumsum(lines_to, axis=1) - lines_to)
    return higher, lower


def _within(places: int, start: np.ndarray, end: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Link bytes (places,) of legs from `start` to `end` carrying `nbytes` on one line (route's _legs, one
    line)."""
    higher, lower = _legs(Legs(np.zeros_like(start), start, end, np.asarray(nbytes, np.float64)), 1, places)
    return higher[0], lower[0]


@dataclass(frozen=True, eq=False)
class Groups:
    """A MeshGEMM operand axis's indices grouped by where they are and where they go: each distinct pair of
    `home` (the line -- row or column -- of the region holding them in the decode's layout) and `block` (the
    MeshGEMM block they go to: a k panel, an n column block), and how many indices share it (`count`)."""

    home: np.ndarray
    block: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, home: np.ndarray, block: np.ndarray) -> Groups:
        (h, b), count = _groups(home, block)
        return cls(h, b, count)


def _gemm_b(region: Region, k_home: np.ndarray, n_home: np.ndarray, k_over_x: bool) -> LinkLoad:
    """The values of a MeshGEMM's B (K, N) on the s x s corner from their decode homes (k index -> its
    column when k_over_x, else its row; n index -> the other), one message per pair of cores, routed as
    :func:`route` routes them, in closed form (a value's bytes: 1): every link's bytes, summed over the
    pairs of k and n groups without listing them, the messages, the longest route."""
    h, w, s = region.h, region.w, min(region.h, region.w)
    nk, nn, places = len(k_home), len(n_home), np.array(ring("meshgemm", s))
    k = Groups.of(k_home, np.arange(nk) // cdiv(nk, s))  # by k's home and panel
    n = Groups.of(n_home, np.arange(nn) // cdiv(nn, s))  # by n's home and column block
    (kh, panel, kc), (nh, j, nc) = (k.home, k.block, k.count), (n.home, n.block, n.count)
    load = LinkLoad(region)
    if k_over_x:  # src (n's row, k's column): along n's row to n's ring column, down it to k's panel's row
        load.bytes[E], load.bytes[W] = _cross(_hist((h, w), (nh, places[j]), nc), _hist((w,), (kh,), kc))
    else:  # src (k's row, n's column)
        higher, lower = _within(w, nh, places[j], nc)
        rows = _hist((h,), (kh,), kc)
        load.bytes[E], load.bytes[W] = np.outer(rows, higher), np.outer(rows, lower)
    for jj in np.unique(j):
        to = places[(panel - jj) % s]  # each k group's destination row, on column places[jj]
        if k_over_x:
            south, north = _cross(_hist((1, h), (0 * to, to), kc), _hist((h,), (nh[j == jj],), nc[j == jj]))
            south, north = south[0], north[0]
        else:
            south, north = (nc[j == jj].sum() * a for a in _within(h, kh, to, kc))
        load.bytes[S, :, places[jj]] += south
        load.bytes[N, :, places[jj]] += north
    load.messages = len(kc) * len(nc) - _stay(region, k, n, k_over_x)
    load.hops = _longest(region, k, n, k_over_x)
    return load


def _stay(region: Region, k: Groups, n: Groups, k_over_x: bool) -> int:
    """How many (k group, n group) pairs of _gemm_b start at their destination core."""
    s = min(region.h, region.w)
    places = np.array(ring("meshgemm", s))
    at = np.full(max(region.h, region.w), -1)
    at[places] = np.arange(s)  # a row's (or column's) ring index, -1 beyond the square
    (kh, panel), (nh, j) = (k.home, k.block), (n.home, n.block)
    if k_over_x:  # n's row is the destination row and k's column n's ring column
        has = np.zeros((region.w, s), bool)
        has[kh, panel] = True
        ok = at[nh] >= 0
        return int(has[places[j[ok]], (at[nh[ok]] + j[ok]) % s].sum())
    ok = at[kh] >= 0  # k's row is the destination row and n's column n's ring column
    per_shift = np.bincount((panel[ok] - at[kh[ok]]) % s, minlength=s)
    return int(per_shift[j[nh == places[j]]].sum())


def _longest(region: Region, k: Groups, n: Groups, k_over_x: bool) -> int:
    """The longest route of _gemm_b's pairs: for every (panel, ring column), the farthest k and n homes."""
    s = min(region.h, region.w)
    places = np.array(ring("meshgemm", s))
    (kh, panel), (nh, j) = (k.home, k.block), (n.home, n.block)

    def extremes(home: np.ndarray, by: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.full(s, np.iinfo(np.int64).max), np.full(s, -1)
        np.minimum.at(lo, by, home)
        np.maximum.at(hi, by, home)
        return lo, hi

    (klo, khi), (nlo, nhi) = extremes(kh, panel), extremes(nh, j)
    p, c = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")  # panel, ring column
    x, y = places[c], places[(p - c) % s]
    if k_over_x:  # k's column against x, n's row against y
        far = np.maximum(abs(klo[p] - x), abs(khi[p] - x)) + np.maximum(abs(nlo[c] - y), abs(nhi[c] - y))
    else:
        far = np.maximum(abs(nlo[c] - x), abs(nhi[c] - x)) + np.maximum(abs(klo[p] - y), abs(khi[p] - y))
    return int(far[(khi[p] >= 0) & (nhi[c] >= 0)].max(initial=0))


def _add(loads: list[LinkLoad], scale: int) -> LinkLoad:
    out = LinkLoad(loads[0].region)
    for load in loads:
        out.add(load)
    out.bytes *= scale
    return out


@lru_cache(maxsize=64)
def weights_load(config: LlamaConfig, region: Region, groups: int, itemsize: int) -> LinkLoad:
    """A layer's weight matrices from the decode's blocks into its MeshGEMMs' B blocks (module doc), values
    of `itemsize` bytes, each matrix's values between two cores one message; `groups`: the decode's head
    groups."""
    c, h, w = config, region.h, region.w
    dims, hid = _owner(c.dim, w), _owner(c.dense_hidden, h)
    q, kv = head_rows(c.n_heads, c.head_dim, h, groups), head_rows(c.n_kv_heads, c.head_dim, h, groups)
    return _add([_gemm_b(region, dims, np.concatenate([q, kv, kv]), True),  # QKV: W (out y, in x)
                 _gemm_b(region, q, dims, False),  # o: wo (dim x, heads y)
                 _gemm_b(region, dims, np.concatenate([hid, hid]), True),  # gate and up
                 _gemm_b(region, hid, dims, False)], itemsize)  # down


def _cross_from(lines_from: np.ndarray, to: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_cross` for legs whose line and start come from one side (lines_from (lines, places)) and
    whose end from the other (to (places,))."""
    higher = np.cumsum(lines_from, axis=1) * (to.sum() - np.cumsum(to))[None, :]
    lower = np.cumsum(lines_from[:, ::-1], axis=1)[:, ::-1] * (np.cumsum(to) - to)[None, :]
    return higher, lower


@dataclass(frozen=True, eq=False)
class Points:
    """Cores of a region, one per key of a group: column `x` and row `y` (arrays of one length) from its
    corner."""

    x: np.ndarray
    y: np.ndarray


def _meet(region: Region, a: Points, b: Points) -> int:
    """How many (a key, b key) pairs sit at the same core of `region`."""
    shape = (region.h, region.w)
    return int(np.dot(_hist(shape, (a.y, a.x), np.ones(len(a.x))).ravel(),
                      _hist(shape, (b.y, b.x), np.ones(len(b.x))).ravel()))


def _far(a: Points, b: Points) -> int:
    """The longest |ax - bx| + |ay - by| over every pair of a's and b's points."""
    return int(max(np.max(sx * a.x + sy * a.y) + np.max(-sx * b.x - sy * b.y)
                   for sx in (1, -1) for sy in (1, -1)))


def _pairwise(region: Region, rows: tuple, cols: tuple) -> LinkLoad:
    """Every (a key, b key) pair a message of ca * cb values, from src to dst (keys' points; module's XY
    route): rows = ((row legs' line, end) from one side, start from the other, which side is which as
    _cross takes them); cols likewise for the column legs as _cross_from takes them (lines, places) = (x,
    y). The caller sets messages and hops."""
    load = LinkLoad(region)
    load.bytes[E], load.bytes[W] = _cross(*rows)
    south, north = _cross_from(*cols)
    load.bytes[S], load.bytes[N] = south.T, north.T
    return load


@lru_cache(maxsize=256)
def kv_load(config: LlamaConfig, region: Region, chunk: PromptChunk, groups: int, itemsize: int) -> LinkLoad:
    """A prompt `chunk`'s K and V into the decode's cache, and the cached positions' moves east (module doc):
    each part's values between two cores one message."""
    c, h, w = config, region.h, region.w
    start, tokens = chunk.start, chunk.tokens
    s, places = min(h, w), np.array(ring("meshgemm", min(h, w)))
    rows = np.concatenate([head_rows(c.n_kv_heads, c.head_dim, h, groups)] * 2)  # K then V
    after = kv_columns(chunk.context, w)
    width = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim  # the QKV product's columns: K then V after Q
    t, cols = np.arange(tokens), c.n_heads * c.head_dim + np.arange(2 * c.kv_dim)
    (i, cm), tc = _groups(t // cdiv(tokens, s), after[start + t])  # token block, cache column
    (j, r), cc = _groups(cols // cdiv(width, s), rows)  # column block, cache row
    load = _pairwise(region, (_hist((h, w), (places[i], cm), tc), _hist((w,), (places[j],), cc)),
                     (_hist((w, h), (cm, places[i]), tc), _hist((h,), (r,), cc)))
    tokens_at, cols_at = Points(x=cm, y=places[i]), Points(x=places[j], y=r)  # the two sides' keys as cores
    load.messages = len(tc) * len(cc) - _meet(region, tokens_at, cols_at)
    load.hops = _far(tokens_at, cols_at)
    if start:
        (was, now), pc = _groups(kv_columns(start, w), after[:start])
        per_row = np.bincount(rows, minlength=h)
        higher, lower = _within(w, was, now, pc)
        load.bytes[E] += np.outer(per_row, higher)
        load.bytes[W] += np.outer(per_row, lower)
        load.messages += int(np.count_nonzero(was != now) * np.count_nonzero(per_row))
        load.hops = max(load.hops, int(np.abs(now - was).max()))
    load.bytes *= itemsize
    return load


@lru_cache(maxsize=256)
def kv_read_load(config: LlamaConfig, region: Region, chunk: PromptChunk, groups: int, itemsize: int
                 ) -> LinkLoad:
    """A later `chunk`'s cached positions' (its start) K and V from the decode's cache into the attention's
    blocks over the positions of its context (module doc)."""
    c, h, w = config, region.h, region.w
    start, s = chunk.start, min(h, w)
    places = np.array(ring("meshgemm", s))
    rows = np.concatenate([head_rows(c.n_kv_heads, c.head_dim, h, groups)] * 2)  # K then V
    d = np.tile(np.arange(c.head_dim), 2 * c.n_kv_heads)
    (col, i), pc = _groups(kv_columns(start, w), np.arange(start) // cdiv(chunk.context, s))
    (r, blk), dc = _groups(rows, d // cdiv(c.head_dim, s))  # cache row, head_dim block
    load = _pairwise(region, (_hist((h, w), (r, places[blk]), dc), _hist((w,), (col,), pc)),
                     (_hist((w, h), (places[blk], r), dc), _hist((h,), (places[i],), pc)))
    cached_at, dims_at = Points(x=col, y=places[i]), Points(x=places[blk], y=r)  # the two sides' keys as cores
    load.messages = len(pc) * len(dc) - _meet(region, cached_at, dims_at)
    load.hops = _far(cached_at, dims_at)
    load.bytes *= itemsize
    return load


@lru_cache(maxsize=256)
def heads_load(config: LlamaConfig, region: Region, chunk: PromptChunk, itemsize: int) -> LinkLoad:
    """A prompt `chunk`'s Q, K and V from the QKV product's C blocks (token block t // mb, column
    block of the (tokens, (nh + 2 nkv) hd) product) into the attention's per-head C blocks (Q: each query
    head's (tokens, hd), token block t // mb; K and V: each K/V head's (start + tokens, hd) context, token
    block (start + t) // cdiv(start + tokens, s); head_dim block d // cdiv(hd, s)): two parts, Q and K/V, each
    pair of cores' values one message along the source's row, then the destination's column."""
    c, h, w, s = config, region.h, region.w, min(region.h, region.w)
    start, tokens = chunk.start, chunk.tokens
    places, t, hd = np.array(ring("meshgemm", s)), np.arange(tokens), c.head_dim
    width, qd = (c.n_heads + 2 * c.n_kv_heads) * hd, c.n_heads * hd
    row = places[t // cdiv(tokens, s)]
    cols = np.arange(width)
    col_from, col_to = places[cols // cdiv(width, s)], places[(cols % hd) // cdiv(hd, s)]
    q, kv = cols < qd, cols >= qd
    parts = [((row, row), (col_from[q], col_to[q])),
             ((row, places[(start + t) // cdiv(chunk.context, s)]), (col_from[kv], col_to[kv]))]
    load = LinkLoad(region)
    for (rs, rd), (a, z) in parts:
        (rs, rd), tc = _groups(rs, rd)
        (a, z), cc = _groups(a, z)
        higher, lower = _within(w, a, z, cc)  # along the source's row
        by_row = _hist((h,), (rs,), tc)
        load.bytes[E] += np.outer(by_row, higher)
        load.bytes[W] += np.outer(by_row, lower)
        south, north = _within(h, rs, rd, tc)  # down the destination's column
        by_col = _hist((w,), (z,), cc)
        load.bytes[S] += np.outer(south, by_col)
        load.bytes[N] += np.outer(north, by_col)
        load.messages += len(tc) * len(cc) - int(np.count_nonzero(rs == rd)) * int(np.count_nonzero(a == z))
        load.hops = max(load.hops, int(np.abs(a - z).max(initial=0) + np.abs(rs - rd).max(initial=0)))
    load.bytes *= itemsize
    return load
