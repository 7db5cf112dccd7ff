"""A Wafer's distributed shared memory: named tensors whose blocks live in the tile actors' core memory.

Contract: ``wafer.dsm`` (a :class:`DSM`) allocates a tensor as a Layout over a region (each core's block
booked in its SRAM; SramOverflow names the tensor, the core and the bytes asked and free), puts a host array
into the cores' blocks (of the tensor's shape and dtype: nothing is cast silently), gets it back (a dead
core's block is lost: CoreFailed names it, unless a ``fill`` stands for it), reads one element, names the
cores that own an element, and frees it. A name never allocated (or freed) is :class:`UnknownTensor`
naming the tensors that exist; a bad shape, dtype or name is a TypeError or ValueError naming the argument.
"""

from __future__ import annotations

import numpy as np

from waferrt.actors.tile import Tile

from .core.dtypes import check_numpy_dtype
from .core.layout import Disagreement, Layout, check_shape, copies_disagree, from_blocks, to_blocks
from .core.mesh import Coord, Region, TileId


class UnknownTensor(KeyError):
    """A DSM tensor name that was never allocated (or was freed)."""

    def __str__(self) -> str:  # the message itself, not KeyError's quoted repr
        return str(self.args[0])


class CopiesDiffer(ValueError):
    """The copies of a replicated DSM tensor's block differ between cores (``dsm.get(name, copy=(x, y))`` reads
    one line's copy)."""


class DSM:
    """Named distributed tensors: each a Layout over a region, its blocks in the tiles' core memory."""

    def __init__(self, wafer):  # the Wafer (waferrt.runtime) whose tiles hold the blocks
        self._w = wafer
        self.layouts: dict[str, Layout] = {}

    def alloc(self, name: str, shape, region: Region | None = None, split=None, granule=(),
              dtype: str = "float32") -> Layout:
        """Allocate `name` of `shape` over `region` (default: the whole mesh). `split` gives each axis's mesh
        axis ("x", "y" or None for replicated); by default the last axis is split over x and the one before
        over y. Every core's block is booked in its SRAM (SramOverflow names the tensor, the core and the
        bytes asked and free).

        >>> import waferrt
        >>> with waferrt.Wafer(spec="tiny", mesh=(8, 4), tile=(4, 4)) as wafer:
        ...     layout = wafer.dsm.alloc("w", (4, 8, 16), split=("y", "x", None))  # 16 floats per core
        ...     layout.block_shape(), wafer.dsm.owners("w", (3, 5, 0))
        ((1, 1, 16), [Coord(x=5, y=3)])
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"a DSM tensor's name is a non-empty str, got {name!r}")
        if name in self.layouts:
            raise ValueError(f"DSM tensor {name!r} exists; free it first or pick another name")
        region = self._w.region_of(region)
        shape = check_shape(shape)
        if split is None:
            split = (None,) * max(len(shape) - 2, 0) + ("y", "x")[-len(shape):]
        if check_numpy_dtype(dtype) == "bfloat16":
            raise ValueError("a DSM tensor holds a numpy dtype; bfloat16 is a storage dtype of the decode only: "
                             "use dtype='float16' or 'float32'")
        layout = Layout(shape, region, tuple(split), tuple(granule), dtype)
        tiles = self._w.mesh.tiles_of(region)
        self._w.live()
        _, errors = self._w.gather([(t, Tile.alloc, (name, layout)) for t in tiles])
        if errors:  # undo the tiles that booked it; report the first failing tile's error
            self._w.call([(t, Tile.free, (name,)) for i, t in enumerate(tiles) if i not in errors])
            raise errors[min(errors)]
        self.layouts[name] = layout
        return layout

    def put(self, name: str, array: np.ndarray) -> None:
        """Host -> cores: each core receives its block (through the wafer edge). The array has the tensor's
        shape and dtype: nothing is cast silently."""
        layout = self._layout(name)
        array = np.asarray(array)
        if array.dtype != np.dtype(layout.dtype):
            raise TypeError(f"DSM tensor {name!r} holds {layout.dtype} but the array is {array.dtype}; cast it "
                            f"explicitly, e.g. wafer.dsm.put({name!r}, array.astype(np.{layout.dtype}))")
        if array.shape != layout.shape:
            raise ValueError(f"DSM tensor {name!r} has shape {layout.shape} but the array has shape "
                             f"{array.shape}; put an array of the tensor's shape")
        blocks = to_blocks(array, layout)
        tiles = self._w.mesh.tiles_of(layout.region)
        self._w.call([(t, Tile.put, (name, blocks[self._window(t, layout)])) for t in tiles])

    def get(self, name: str, fill=None, copy: Coord | tuple[int, int] | None = None) -> np.ndarray:
        """Cores -> host: the whole tensor. A dead core's block is lost: reading it raises CoreFailed naming the
        core and the block, unless `fill` (e.g. np.nan) is given to stand for the lost elements. A tensor
        replicated along a mesh axis (``split`` without "x" or "y") has a copy on every line of cores: they
        must agree (:class:`CopiesDiffer` names two cores whose copies differ), unless `copy` = (x, y), a
        core of the region, says whose line's copy to read."""
        layout = self._layout(name)
        tiles = self._w.mesh.tiles_of(layout.region)
        parts = self._w.call([(t, Tile.get, (name, fill)) for t in tiles])
        blocks = np.zeros(layout.region.shape + layout.max_block_shape(), layout.dtype)
        for t, part in zip(tiles, parts, strict=True):
            blocks[self._window(t, layout)] = part
        if copy is not None:
            return from_blocks(blocks, layout, self._copy_at(name, layout, copy))
        if (differ := copies_disagree(blocks, layout, self._dead_mask(layout))) is not None:
            raise CopiesDiffer(self._differ_message(name, layout, blocks, differ))
        return from_blocks(blocks, layout)

    def _copy_at(self, name: str, layout: Layout, copy) -> Coord:
        """`copy` = (x, y), a core of the tensor's region, as that Coord."""
        core = Coord(*copy)
        if not layout.region.contains(core):
            raise ValueError(f"copy={tuple(copy)} is not a core of DSM tensor {name!r}'s region {layout.region}; "
                             "give copy=(x, y) of one of its cores")
        return core

    def _dead_mask(self, layout: Layout) -> np.ndarray:
        """(rows, cols) of the region: True where the core is dead (its copy is lost, not compared)."""
        mask = np.zeros(layout.region.shape, bool)
        if self._w.session is not None:
            for c in self._w.fault_map().cores:
                if layout.region.contains(c):
                    mask[layout.region.local(c)] = True
        return mask

    @staticmethod
    def _differ_message(name: str, layout: Layout, blocks: np.ndarray, differ: Disagreement) -> str:
        a, b = differ.core, differ.first
        mine, theirs = blocks[layout.region.local(a)], blocks[layout.region.local(b)]
        gap = float(np.max(np.abs(mine.astype(np.float64) - theirs.astype(np.float64))))
        return (f"DSM tensor {name!r} is replicated (split {layout.split}) but core {a}'s copy of its block differs "
                f"from core {b}'s (by up to {gap:g}): a kernel stored different values on different lines of cores. "
                f"Read one line's copy with wafer.dsm.get({name!r}, copy=({a.x}, {a.y})), or make the kernel store "
                "the same value on every copy (an allreduce or broadcast along the replicated axis)")

    def _window(self, t: TileId, layout: Layout) -> tuple[slice, slice]:
        """Tile t's cores as a window into the (rows, cols) of the tensor's region."""
        return layout.region.window(self._w.mesh.tile_region(t).intersect(layout.region))

    def owners(self, name: str, index: tuple[int, ...]) -> list[Coord]:
        """The cores that hold element `index` of `name`."""
        return self._layout(name).owners(tuple(index))

    def read(self, name: str, index: tuple[int, ...]):
        """One element, read from (the first of) the core(s) that own it."""
        layout = self._layout(name)
        core = layout.owners(tuple(index))[0]
        row, col = layout.region.local(core)
        (block,) = self._w.call([(self._w.mesh.tile_of(core), Tile.read, (name, row, col))])
        local = tuple(i - sl.start for i, sl in zip(index, layout.block_slices(row, col), strict=True))
        return block[local]

    def free(self, name: str) -> None:
        layout = self._layout(name)
        self._w.call([(t, Tile.free, (name,)) for t in self._w.mesh.tiles_of(layout.region)])
        del self.layouts[name]

    def _layout(self, name: str) -> Layout:
        self._w.live()
        try:
            return self.layouts[name]
        except (KeyError, TypeError):
            raise UnknownTensor(f"no DSM tensor {name!r}; allocated: {sorted(self.layouts) or 'none'}") from None
