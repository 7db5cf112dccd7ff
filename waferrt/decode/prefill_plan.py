"""Where every value of a layer's prefill goes between the decode's layout and the MeshGEMM's: the Moves.

Contract: each function returns the :class:`~waferrt.decode.transport.Move` s of one move of
waferrt.decode.relayout (whose closed forms book them; tests/unit/test_transport.py ties the two link for
link), made by numbering the source buffer and laying the numbers out with the emulator's own layout
functions (decode.pack's blocks, kernels.gemm.place / spread, kvcache.kv_columns), cached per shape:
:func:`weight_moves` a layer's packed matrices into the B blocks of its four MeshGEMMs (and back, each
value by the route it came, into the decode's blocks, repacked by ``decode.pack.out_in``); :func:`head_moves`
the QKV product's C blocks into the attention's per-head blocks (Q; K and V into the context's) and into the cache's
cores (:func:`arrivals`: each core of row r and column c takes the chunk's positions the cache keeps at
column c, head_dim's slice of row r); :func:`read_move` a later chunk's cached K/V from the cache's cores
(:func:`cache_buffer`) into the context's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from waferrt.core.layout import from_blocks
from waferrt.core.mesh import Region
from waferrt.kernels.gemm import Grid, place, spread
from waferrt.model.config import LlamaConfig

from .kvcache import PromptChunk, kv_columns
from .layout import layer_layouts
from .pack import blocks_of
from .transport import Holder, Move, numbered, source_numbers

GEMMS = (("qkv", "wqkv", "y"), ("o", "wo", "x"), ("gate_up", "w13", "y"), ("down", "w2", "x"))  # (GEMM, array, out)


def _matrices(config: LlamaConfig, region: Region, key: str, a: np.ndarray) -> np.ndarray:
    """A packed array of decode.pack (any dtype: numbers too) -> the MeshGEMM's B (k, n) = W^T it holds (y = W
    @ x; QKV's wq, wk, wv and gate_up's w_gate, w_up side by side along n)."""
    lay, R = layer_layouts(config, region), region.h
    nh, nkv, hd = config.n_heads, config.n_kv_heads, config.head_dim
    if key == "wqkv":
        hd_r = a.shape[0] // (R * (nh + 2 * nkv))
        b = blocks_of(a, "y", region).reshape(R, region.w, nh + 2 * nkv, hd_r, -1)
        parts = [from_blocks(b[:, :, :nh], lay["wq"]).reshape(nh * hd, -1),
                 from_blocks(b[:, :, nh:nh + nkv], lay["wk"]).reshape(nkv * hd, -1),
                 from_blocks(b[:, :, nh + nkv:], lay["wv"]).reshape(nkv * hd, -1)]
    elif key == "wo":
        hd_r = a.shape[1] // (R * nh)
        parts = [from_blocks(blocks_of(a, "x", region).reshape(R, region.w, -1, nh, hd_r), lay["wo"]).reshape(
            config.dim, nh * hd)]
    elif key == "w13":
        b = blocks_of(a, "y", region).reshape(R, region.w, 2, -1, a.shape[1] // region.w)
        parts = [from_blocks(b[:, :, 0], lay["w_gate"]), from_blocks(b[:, :, 1], lay["w_up"])]
    else:
        parts = [from_blocks(blocks_of(a, "x", region), lay["w_down"])]
    return np.concatenate(parts).T


@dataclass(frozen=True, eq=False)
class WeightMove:
    """One GEMM's B from its packed array (`key`, outputs over `out_over`) and back into `blocks` (the decode's
    per-core blocks of that array, (rows, cols, out, in))."""

    key: str
    out_over: str
    into: Move  # packed -> B blocks (rows, cols, 1, kb, nb) of the square at the region's corner
    back: Move  # B blocks -> the decode's per-core blocks


@lru_cache(maxsize=8)
def weight_moves(config: LlamaConfig, region: Region, shapes: tuple[tuple[int, int], ...]) -> tuple[WeightMove, ...]:
    """The four GEMMs' weight moves of a layer on `region`, whose packed arrays (GEMMS' order) have `shapes`."""
    square, out = _square(region), []
    for (_, key, out_over), shape in zip(GEMMS, shapes, strict=True):
        packed = Holder(shape, (region.h, region.w), out_over)
        nums = source_numbers(packed)
        b = _matrices(config, region, key, nums)
        _, pb = place("meshgemm", Grid.of(square), square, np.zeros((1, b.shape[0]), np.int64), b)
        into = numbered(region, packed, pb)
        blocks = blocks_of(nums, out_over, region)  # (R, C, out, in) of packed numbers: the decode's blocks
        at = np.empty(blocks.size, np.int64)
        at[blocks.reshape(-1) - 1] = np.arange(blocks.size)  # packed index -> its place in the blocks
        back = Move(region, into.target, Holder(blocks.shape, blocks.shape[:2]), into.dst, at[into.src], yx=True)
        out.append(WeightMove(key, out_over, into, back))
    return tuple(out)


def hd_rows(config: LlamaConfig, region: Region) -> tuple[np.ndarray, np.ndarray]:
    """(head_dim,) the row of the region holding each of a head's dims (whole RoPE pairs), and its place there."""
    lay = layer_layouts(config, region)["wk"]
    row, at = np.empty(config.head_dim, np.int64), np.empty(config.head_dim, np.int64)
    for r in range(region.h):
        sl = lay.block_slices(r, 0)[1]
        row[sl], at[sl] = r, np.arange(sl.stop - sl.start)
    return row, at


def _column_places(columns: np.ndarray) -> np.ndarray:
    """(n,) each position's place among those of its column, oldest first."""
    order = np.argsort(columns, kind="stable")
    rank = np.empty(len(columns), np.int64)
    starts = np.searchsorted(columns[order], columns[order])
    rank[order] = np.arange(len(columns)) - starts
    return rank


def cache_shape(config: LlamaConfig, region: Region, columns: np.ndarray) -> tuple[int, ...]:
    """A per-core buffer of K/V entries at `columns`: (rows, cols, places, 2 (K, V), n_kv, hd_r)."""
    hd_r = int(np.bincount(hd_rows(config, region)[0], minlength=region.h).max())
    per = int(np.bincount(columns, minlength=region.w).max(initial=0))
    return region.h, region.w, max(per, 1), 2, config.n_kv_heads, hd_r


def _entries(config: LlamaConfig, region: Region, columns: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """`numbers` (n, 2, n_kv, hd) of n positions' K/V entries laid out in the cache's cores: (cache_shape)."""
    out = np.zeros(cache_shape(config, region, columns), numbers.dtype)
    row, at = hd_rows(config, region)
    rank = _column_places(columns)
    for d in range(config.head_dim):
        out[row[d], columns, rank, :, :, at[d]] = numbers[:, :, :, d]
    return out


def cache_buffer(config: LlamaConfig, region: Region, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The cache's cores holding a request's first n positions, k and v (n, R, n_kv, hd_r) as the cache keeps
    them by row (MeshKVCache.ordered): the buffer :func:`read_move` reads."""
    n = len(k)
    columns, row, at = kv_columns(n, region.w), *hd_rows(config, region)
    both = np.stack([k, v], axis=1)  # (n, 2, R, nkv, hd_r)
    full = both[:, :, row, :, at].transpose(1, 2, 3, 0)  # (n, 2, nkv, hd)
    return _entries(config, region, columns, full)


def arrivals(config: LlamaConfig, region: Region, chunk: PromptChunk, buf: np.ndarray) -> np.ndarray:
    """What the cache's cores took of a prompt `chunk` (buf: :func:`head_moves`' cache buffer) as the cache's
    insert takes it: K, V (tokens, R, n_kv, hd_r), each position read at the column the cache keeps it at,
    head_dim's slice of each row from that row."""
    columns = kv_columns(chunk.context, region.w)[chunk.start:]
    rank = _column_places(columns)
    got = buf[:, columns, rank]  # (R, T, 2, nkv, hd_r)
    return got[:, :, 0].transpose(1, 0, 2, 3), got[:, :, 1].transpose(1, 0, 2, 3)


@dataclass(frozen=True, eq=False)
class HeadMoves:
    """A chunk's moves out of the QKV product's C blocks: into Q's per-head blocks (rows, cols, nh, mb, db),
    into the context's K/V blocks (rows, cols, 2, nkv, kb, db), and into the cache's cores (cache_shape)."""

    q: Move
    kv: Move
    cache: Move


def _square(region: Region) -> Region:
    """The square at the corner of a region's shape where the prefill's MeshGEMMs leave their blocks."""
    s = min(region.w, region.h)
    return Region(0, 0, s, s)


def _context_blocks(config: LlamaConfig, region: Region, chunk: PromptChunk, rows: np.ndarray, first: int
                    ) -> np.ndarray:
    """rows (n, 2, nkv, hd) of numbers at context positions first..first+n-1 of a prompt `chunk` -> its
    context's K/V blocks (s, s, 2, nkv, kb, db), zeros at the other positions."""
    square = _square(region)
    grid = Grid.of(square)
    full = np.zeros((chunk.context,) + rows.shape[1:], rows.dtype)
    full[first:first + len(rows)] = rows
    return np.stack([np.stack([spread(grid, square, full[:, i, g]) for g in range(config.n_kv_heads)], axis=2)
                     for i in range(2)], axis=2)


@lru_cache(maxsize=64)
def head_moves(config: LlamaConfig, region: Region, chunk: PromptChunk) -> HeadMoves:
    """The moves of a prompt `chunk` out of the QKV product's C blocks (HeadMoves)."""
    start, T = chunk.start, chunk.tokens
    square = _square(region)
    s, grid = square.w, Grid.of(square)
    nh, nkv, hd = config.n_heads, config.n_kv_heads, config.head_dim
    width = (nh + 2 * nkv) * hd
    nums = np.arange(1, T * width + 1, dtype=np.int64).reshape(T, width)  # the product's values
    c_nums = spread(grid, square, nums)  # where the product leaves each value
    source = Holder(c_nums.shape, (s, s))
    c_at = np.zeros(T * width + 1, np.int64)
    c_at[c_nums.reshape(-1)] = np.arange(1, c_nums.size + 1)  # value -> its source number (flat index + 1)
    by_flat = c_at[nums]  # (T, width): each value's source number
    q = np.stack([spread(grid, square, by_flat[:, h * hd:(h + 1) * hd]) for h in range(nh)], axis=2)
    kv = by_flat[:, nh * hd:].reshape(T, 2, nkv, hd)
    return HeadMoves(numbered(region, source, q),
                     numbered(region, source, _context_blocks(config, region, chunk, kv, start)),
                     numbered(region, source, _entries(config, region,
                                                       kv_columns(chunk.context, region.w)[start:], kv)))


@lru_cache(maxsize=64)
def read_move(config: LlamaConfig, region: Region, chunk: PromptChunk) -> Move:
    """A later prompt `chunk`'s cached K/V from the cache's cores (:func:`cache_buffer` of its start
    positions) into the context's K/V blocks (HeadMoves.kv's buffer)."""
    start = chunk.start
    columns = kv_columns(start, region.w)
    source = Holder(cache_shape(config, region, columns), (region.h, region.w))
    nums = source_numbers(source)  # every entry of the cores' buffer, numbered
    row, at = hd_rows(config, region)
    rank = _column_places(columns)
    entries = np.empty((start, 2, config.n_kv_heads, config.head_dim), np.int64)
    for d in range(config.head_dim):  # dim d of every entry, at its row's place
        entries[:, :, :, d] = nums[row[d], columns, rank, :, :, at[d]]
    return numbered(region, source, _context_blocks(config, region, chunk, entries, 0))

