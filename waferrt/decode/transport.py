"""The prefill's layout moves carried value by value from the core that holds a value to the core that needs it.

Contract: a :class:`Move` says, for every value of a move of waferrt.decode.relayout, where it is read (a
flat index of the source buffer, whose core :class:`Holder` knows) and where it is written (a flat index of
the destination buffer, a per-core buffer (rows, cols, *block): its core, and the place in that core's
block). :func:`carry` moves the values: hop by hop (``hop_by_hop=True``, the checked mode: every message
steps one link at a time along its source's row, then along its destination's column, as
``relayout.route`` books it, and is written into the block of the core where its last hop left it, so a
message routed to the wrong core writes the wrong core's block), or at once (the fast path, as the
decode's collectives take theirs: each value written to its destination core's block in one gather;
tests/unit/test_transport.py holds the two to the same buffers and the walk's link bytes to
``relayout.route``'s and to the closed forms, link for link). :func:`numbered` builds a Move from a
destination buffer laid out with source numbers (flat index + 1; 0: nothing), so every layout function of
the emulator (kernels.gemm.place/spread, the cache's columns) says where values go, not a second copy of
it. A move's values stay in the region of the layer (a decode region lies wholly in one tile): nothing
crosses a tile border.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.mesh import Region

from .linkload import E, LinkLoad, N, S, W
from .relayout import route


@dataclass(frozen=True)
class Holder:
    """Which core holds each flat index of a buffer of `shape`: a per-core buffer (rows, cols, *block)
    (`packed` None), or a packed matrix of decode.pack (`packed` = "y": (rows * out, cols * in), "x": (cols *
    out, rows * in)) over a region of `grid` = (rows, cols) cores."""

    shape: tuple[int, ...]
    grid: tuple[int, int]
    packed: str | None = None

    def __post_init__(self) -> None:
        if self.packed not in (None, "x", "y"):
            raise ValueError(f"a packed matrix has its outputs over 'y' or 'x' (decode.pack), got {self.packed!r}")
        if self.packed is None and tuple(self.shape[:2]) != tuple(self.grid):
            raise ValueError(f"a per-core buffer of shape {self.shape} starts with its grid {self.grid}")

    @property
    def block(self) -> int:
        """Values per core of a per-core buffer."""
        return int(np.prod(self.shape[2:], dtype=np.int64))

    def cores(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(y, x) of the cores holding the flat indices `flat`."""
        if self.packed is None:
            return np.divmod(flat // self.block, self.grid[1])
        rows, cols = self.grid
        line, at = np.divmod(flat, self.shape[1])
        lines, cores = (rows, cols) if self.packed == "y" else (cols, rows)
        a, b = line // (self.shape[0] // lines), at // (self.shape[1] // cores)
        return (a, b) if self.packed == "y" else (b, a)


@dataclass(frozen=True, eq=False)
class Move:
    """Values from flat indices `src` of a buffer held as `source` says to flat indices `dst` of a per-core
    buffer `target`, on `region`'s cores (the buffers' grids at its corner)."""

    region: Region
    source: Holder
    target: Holder
    src: np.ndarray  # (n,) int64
    dst: np.ndarray  # (n,) int64
    yx: bool = False  # along the source's column first, then the destination's row (a move's way back)

    def __post_init__(self) -> None:
        if self.target.packed is not None:
            raise ValueError("a move writes into a per-core buffer (rows, cols, *block); pack it afterwards")
        if self.src.shape != self.dst.shape:
            raise ValueError(f"a move pairs each source index with one destination: {self.src.shape} vs "
                             f"{self.dst.shape}")

    def ends(self) -> tuple[np.ndarray, np.ndarray]:
        """(n, 2) the (y, x) of each value's source core and destination core."""
        return np.stack(self.source.cores(self.src), 1), np.stack(self.target.cores(self.dst), 1)

    def load(self, itemsize: int) -> LinkLoad:
        """The move's messages over the links (relayout.route), values of `itemsize` bytes."""
        src, dst = self.ends()
        nbytes = np.full(len(self.src), float(itemsize))
        return mirrored(route(self.region, dst, src, nbytes)) if self.yx else route(self.region, src, dst, nbytes)


def mirrored(load: LinkLoad) -> LinkLoad:
    """The same messages over the same links, the other way: each link's bytes, leaving the core at its other
    end by the opposite side (the busiest link, the longest route and the messages are the same: so is the
    cost)."""
    out = LinkLoad(load.region)
    out.bytes[W][:, 1:], out.bytes[E][:, :-1] = load.bytes[E][:, :-1], load.bytes[W][:, 1:]
    out.bytes[N][1:], out.bytes[S][:-1] = load.bytes[S][:-1], load.bytes[N][1:]
    out.messages, out.hops = load.messages, load.hops
    return out


def numbered(region: Region, source: Holder, placed: np.ndarray) -> Move:
    """The move that fills a per-core buffer laid out as `placed` (rows, cols, *block): each entry the source
    number (flat index + 1) of the value that goes there, 0 where nothing goes."""
    at = np.flatnonzero(placed)
    return Move(region, source, Holder(placed.shape, placed.shape[:2]), placed.reshape(-1)[at] - 1, at)


def source_numbers(holder: Holder) -> np.ndarray:
    """Every value of a buffer held as `holder` says, numbered flat index + 1 (for :func:`numbered`)."""
    return np.arange(1, int(np.prod(holder.shape, dtype=np.int64)) + 1, dtype=np.int64).reshape(holder.shape)


def carry(move: Move, buf: np.ndarray, hop_by_hop: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """`buf` (of move.source's shape) -> the destination buffer (move.target's shape, zeros but where values
    arrive; `out`: a buffer of that shape to write into instead): at once, or hop by hop (module doc)."""
    if buf.shape != move.source.shape:
        raise ValueError(f"move's source is a buffer of shape {move.source.shape}, got {buf.shape}")
    out = np.zeros(move.target.shape, buf.dtype) if out is None else out
    values = buf.reshape(-1)[move.src]
    flat = out.reshape(-1)
    if hop_by_hop:
        flat[walk(move)[0]] = values
    else:
        flat[move.dst] = values
    return out


def walk(move: Move, itemsize: int = 4) -> tuple[np.ndarray, LinkLoad]:
    """Every value's message one link at a time, along its source's row, then its destination's column (with
    ``move.yx``: its source's column, then its destination's row):
    (the flat index of the destination buffer where each one arrives -- its place in the block of the core
    its last hop reached --, the bytes the hops put on every link)."""
    (y, x), (ty, tx) = (a.copy() for a in move.source.cores(move.src)), move.target.cores(move.dst)
    h, w = move.region.h, move.region.w
    load = LinkLoad(move.region)
    src, dst = move.ends()
    moving = np.any(src != dst, axis=1)
    pairs = np.unique((src[moving, 0] * w + src[moving, 1]) * (h * w) + dst[moving, 0] * w + dst[moving, 1])
    load.messages, load.hops = len(pairs), 0
    while True:
        if move.yx:  # along the source's column first
            down = y != ty
            along = ~down & (x != tx)
        else:  # along the source's row first
            along = x != tx
            down = ~along & (y != ty)
        if not (along.any() or down.any()):
            break
        load.hops += 1
        step_x, step_y = np.sign(tx - x) * along, np.sign(ty - y) * down
        for d, sel in ((E, step_x > 0), (W, step_x < 0), (S, step_y > 0), (N, step_y < 0)):
            np.add.at(load.bytes[d], (y[sel], x[sel]), itemsize)  # by the core the link leaves
        x, y = x + step_x, y + step_y
        if (x < 0).any() or (x >= w).any() or (y < 0).any() or (y >= h).any():
            raise RuntimeError(f"a message of a layout move left the region {move.region} on its route")
    gh, gw = move.target.grid
    if (y >= gh).any() or (x >= gw).any():
        raise RuntimeError(f"a message of a layout move ended at a core outside its {gh}x{gw} destination buffer")
    return (y * gw + x) * move.target.block + move.dst % move.target.block, load
