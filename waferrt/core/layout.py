"""DSM layouts: how a logical tensor is cut into per-core blocks over a region of the mesh.

Contract: a :class:`Layout` says, for each axis of a tensor, whether it is split over the region's
columns ("x"), its rows ("y"), or kept whole in every core (None: replicated along any mesh axis that no
tensor axis is split over). Splits are contiguous, as even as possible (the first chunks one granule
larger), and never cut a granule (e.g. RoPE's adjacent pairs: granule 2). Everything is pure index
arithmetic: which global indices a core holds, which core owns a global index, how many bytes the largest
block takes. Values are frozen and hashable. A layout checks what it is given: every shape entry a whole
number >= 1 (:func:`check_shape`), a known dtype, split entries in "x"/"y"/None, axes that the region's
cores can share; a misuse is a TypeError or ValueError that names the axis and the value.
:class:`Chunks` splits vectors over a line of cores by such a layout and joins them back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .arith import whole
from .dtypes import check_numpy_dtype, itemsize
from .mesh import Coord, Region

AXES = ("x", "y", None)


def chunk_bounds(n: int, parts: int, granule: int = 1) -> np.ndarray:
    """Bounds (parts+1,) of splitting range(n) into `parts` contiguous chunks of whole granules (read-only:
    worked out once per (n, parts, granule), the planner asks for the same ones thousands of times)."""
    return _chunk_bounds(n, parts, granule)


@functools.lru_cache(maxsize=4096)
def _chunk_bounds(n: int, parts: int, granule: int) -> np.ndarray:
    if n % granule:
        raise ValueError(f"an axis of length {n} cannot be cut into whole granules of {granule}")
    units = n // granule
    if parts > units:
        raise ValueError(
            f"cannot split an axis of {units} granule(s) of {granule} over {parts} cores: "
            f"use at most {units} cores along that mesh axis"
        )
    base, extra = divmod(units, parts)
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.concatenate([[0], np.cumsum(sizes)]) * granule
    bounds.setflags(write=False)
    return bounds


@dataclass(frozen=True)
class Layout:
    """Tensor of `shape` over `region`; `split[i]` in {"x", "y", None} for axis i."""

    shape: tuple[int, ...]
    region: Region
    split: tuple[str | None, ...]
    granule: tuple[int, ...] = ()
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", check_shape(self.shape))
        object.__setattr__(self, "split", tuple(self.split))
        object.__setattr__(self, "granule", check_shape(self.granule, "granule") or (1,) * len(self.shape))
        check_numpy_dtype(self.dtype)
        if len(self.split) != len(self.shape) or len(self.granule) != len(self.shape):
            raise ValueError(f"layout of a {len(self.shape)}-d tensor needs one split entry per axis, got {self.split}")
        for s in self.split:
            if s not in AXES:
                raise ValueError(f"split entries are 'x', 'y' or None, got {s!r}")
        for mesh_axis in ("x", "y"):
            if self.split.count(mesh_axis) > 1:
                raise ValueError(f"at most one tensor axis may be split over mesh axis {mesh_axis!r}: {self.split}")
        for i, s in enumerate(self.split):
            if s is not None:
                chunk_bounds(self.shape[i], self._parts(s), self.granule[i])  # validates

    def _parts(self, mesh_axis: str) -> int:
        return self.region.w if mesh_axis == "x" else self.region.h

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    def bounds(self, axis: int) -> np.ndarray:
        """Chunk bounds of tensor axis `axis` over the cores of its mesh axis ([0, n] if not split)."""
        s = self.split[axis]
        if s is None:
            return np.array([0, self.shape[axis]])
        return chunk_bounds(self.shape[axis], self._parts(s), self.granule[axis])

    def block_slices(self, row: int, col: int) -> tuple[slice, ...]:
        """Global index ranges held by the core at (row, col) of the region."""
        out = []
        for i, s in enumerate(self.split):
            b = self.bounds(i)
            k = 0 if s is None else (col if s == "x" else row)
            out.append(slice(int(b[k]), int(b[k + 1])))
        return tuple(out)

    def block_shape(self, row: int = 0, col: int = 0) -> tuple[int, ...]:
        return tuple(sl.stop - sl.start for sl in self.block_slices(row, col))

    def max_block_shape(self) -> tuple[int, ...]:
        """Shape of the largest block (the first core's: chunks are largest first)."""
        return self.block_shape(0, 0)

    def max_block_bytes(self) -> int:
        """The most bytes any core holds: ``core_bytes(self).max()`` (core (0, 0)'s; chunks are largest first)."""
        return int(np.prod(self.max_block_shape(), dtype=np.int64)) * self.itemsize

    def owners(self, index: tuple[int, ...]) -> list[Coord]:
        """Every core that holds element `index` (several when the tensor is replicated)."""
        if len(index) != len(self.shape):
            raise IndexError(f"index {index} has {len(index)} entries; the tensor has shape {self.shape}")
        col = row = None
        for i, (s, v) in enumerate(zip(self.split, index)):
            if not 0 <= v < self.shape[i]:
                raise IndexError(f"index {index} is outside the tensor's shape {self.shape}")
            if s is not None:
                k = int(np.searchsorted(self.bounds(i), v, side="right")) - 1
                if s == "x":
                    col = k
                else:
                    row = k
        cols = [col] if col is not None else range(self.region.w)
        rows = [row] if row is not None else range(self.region.h)
        return [Coord(self.region.x0 + c, self.region.y0 + r) for r in rows for c in cols]


def check_shape(sizes, what: str = "shape") -> tuple[int, ...]:
    """A shape (or granule) as a tuple of ints >= 1; TypeError/ValueError naming the axis otherwise."""
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise TypeError(f"a tensor's {what} is a tuple of whole numbers, e.g. (4, 8); got {sizes!r}")
    sizes = tuple(sizes)
    for i, n in enumerate(sizes):
        whole(f"{what} {sizes} axis {i}", n, least=None)
        if n < 1:
            raise ValueError(f"{what} {sizes}: axis {i} has {n} elements; every axis needs at least 1 "
                             "(a DSM tensor cannot be empty)")
    return tuple(int(n) for n in sizes)


def axis_gather(layout: Layout, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(index (parts, max_chunk), valid (parts, max_chunk)) gathering axis `axis` into padded chunks."""
    b = layout.bounds(axis)
    sizes = np.diff(b)
    width = int(sizes.max())
    offs = np.arange(width)
    valid = offs[None, :] < sizes[:, None]
    index = np.where(valid, b[:-1, None] + offs[None, :], 0)
    return index, valid


def to_blocks(array: np.ndarray, layout: Layout) -> np.ndarray:
    """The tensor cut into per-core blocks: (rows, cols, *max_block_shape), zero-padded where a core's
    chunk is shorter than the first one. Replicated axes are copied to every core."""
    array = np.asarray(array)
    if array.shape != layout.shape:
        raise ValueError(f"array of shape {array.shape} does not match the layout's shape {layout.shape}")
    out = array.astype(np.float32 if layout.dtype == "bfloat16" else layout.dtype, copy=False)
    row_axis = col_axis = None
    pos = 0  # current position of tensor axis i in `out` (split axes become two axes)
    for i, s in enumerate(layout.split):
        if s is None:
            pos += 1
            continue
        index, valid = axis_gather(layout, i)
        out = np.take(out, index, axis=pos)  # axis pos -> (parts, width)
        mask_shape = [1] * out.ndim
        mask_shape[pos], mask_shape[pos + 1] = valid.shape
        np.copyto(out, out.dtype.type(0), where=~valid.reshape(mask_shape))  # in place: `take` made a copy
        if s == "x":
            col_axis = pos
        else:
            row_axis = pos
        pos += 2
    # move the parts axes to the front as (rows, cols); missing ones become broadcast axes of size h/w
    if row_axis is None:
        out = np.expand_dims(out, 0)
        row_axis = 0
        col_axis = col_axis + 1 if col_axis is not None else None
    else:
        out = np.moveaxis(out, row_axis, 0)
        if col_axis is not None and col_axis < row_axis:
            col_axis += 1
    if col_axis is None:
        out = np.expand_dims(out, 1)
    else:
        out = np.moveaxis(out, col_axis, 1)
    h, w = layout.region.h, layout.region.w
    return np.ascontiguousarray(np.broadcast_to(out, (h, w) + out.shape[2:]))


def from_blocks(blocks: np.ndarray, layout: Layout, copy: Coord | None = None) -> np.ndarray:
    """Inverse of to_blocks: reassemble the tensor from (rows, cols, *max_block) blocks; replicated
    copies are read from the row/column of the region's core `copy` (default its first core;
    :func:`copies_disagree` says whether the copies are the same)."""
    out = np.empty(layout.shape, dtype=blocks.dtype)
    row, col = layout.region.local(copy) if copy is not None else (0, 0)
    for r in _distinct(layout, "y", row):
        for c in _distinct(layout, "x", col):
            sl = layout.block_slices(r, c)
            out[sl] = blocks[(r, c) + tuple(slice(0, s.stop - s.start) for s in sl)]
    return out


@dataclass(frozen=True)
class Disagreement:
    """Two cores of a replicated tensor's region whose copies of a block differ: `core`, and `first`, the core
    of the first row or column whose copy it was compared with."""

    core: Coord
    first: Coord


def copies_disagree(blocks: np.ndarray, layout: Layout, skip: np.ndarray) -> Disagreement | None:
    """For a tensor replicated along a mesh axis: the first core (in row-major order) whose copy of its block
    differs from the copy of the first row/column; None when every copy agrees. Cores where `skip` ((rows,
    cols) bool: dead ones) holds are left out."""
    reg = layout.region
    for r in range(reg.h):
        for c in range(reg.w):
            r0, c0 = (r if "y" in layout.split else 0), (c if "x" in layout.split else 0)
            if (r, c) == (r0, c0) or skip[r, c] or skip[r0, c0]:
                continue
            if not np.array_equal(blocks[r, c], blocks[r0, c0], equal_nan=True):
                return Disagreement(Coord(reg.x0 + c, reg.y0 + r), Coord(reg.x0 + c0, reg.y0 + r0))
    return None


def _distinct(layout: Layout, mesh_axis: str, at: int = 0) -> range:
    """The rows (or columns) that hold distinct data: all of them if some axis is split there, else the one
    copy at `at`."""
    n = layout.region.w if mesh_axis == "x" else layout.region.h
    return range(n) if mesh_axis in layout.split else range(at, at + 1)


def core_bytes(layout: Layout) -> np.ndarray:
    """(rows, cols) bytes each core of the region holds for this tensor (its real, unpadded block): the one
    function that says what a layout puts on a core (SRAM booking and the planner's budgets both use it;
    ``Layout.max_block_bytes`` is its maximum, core (0, 0)'s, as chunks are largest first)."""
    per_row = np.ones(layout.region.h, np.int64)
    per_col = np.ones(layout.region.w, np.int64)
    rest = layout.itemsize
    for i, s in enumerate(layout.split):
        sizes = np.diff(layout.bounds(i))
        if s == "x":
            per_col = per_col * sizes
        elif s == "y":
            per_row = per_row * sizes
        else:
            rest *= int(sizes[0])
    return np.outer(per_row, per_col) * rest


class Chunks:
    """Split vectors (..., n) over `parts` cores (padded (..., parts, width)) and join them back."""

    def __init__(self, n: int, parts: int, granule: int = 1):
        lay = Layout((n,), Region(0, 0, parts, 1), ("x",), (granule,))
        self.index, self.valid = axis_gather(lay, 0)
        self.n = n
        # the chunks in order with the padding all at the end: split and join are a pad and a reshape
        self.in_order = bool(self.valid.ravel()[:n].all() and (self.index.ravel()[:n] == np.arange(n)).all())

    def split(self, v: np.ndarray) -> np.ndarray:
        if self.in_order:
            out = np.zeros(v.shape[:-1] + (self.index.size,), v.dtype)
            out[..., :self.n] = v
            return out.reshape(v.shape[:-1] + self.index.shape)
        out = np.take(v, self.index, axis=-1)  # a gather, then the padding zeroed in place: no second copy
        np.copyto(out, v.dtype.type(0), where=~self.valid)
        return out

    def join(self, a: np.ndarray) -> np.ndarray:
        if self.in_order:  # no copy when there is no padding
            return np.ascontiguousarray(a.reshape(a.shape[:-2] + (-1,))[..., :self.n])
        out = np.empty(a.shape[:-2] + (self.n,), a.dtype)
        out[..., self.index[self.valid]] = a[..., self.valid]
        return out
