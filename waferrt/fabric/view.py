"""What a kernel knows without moving data: its tile's cores of the region, what is dead, its DSM blocks.

Contract: :class:`RegionView` is the part of the kernel context (:class:`waferrt.fabric.kernel.Context`
extends it) that asks nothing of the fabric: where this tile's cores are (``shape``, ``coords``,
``positions``), what is dead in the region (``dead_cores``, ``dead_links``, ``alive``, ``link_alive``,
``live``, ``can_send``), this tile's blocks of DSM tensors (``load``, ``store``), and the checks every
primitive makes (a ``where=`` mask, arrays that start with the core axes, a block no larger than a core's
SRAM, no dead core or link needed). Axes: arrays over cores are (rows, cols) = [y, x]; cores are (x, y).
"""

from __future__ import annotations

import numpy as np

from waferrt.core.mesh import Coord, Region
from waferrt.faults.faultmap import FaultMap

from .debug import user_site
from .misuse import BlockTooLarge


class RegionView:
    """This tile's cores of `region` (``tile`` is the tile's own rectangle), the fault map, and the DSM
    blocks ``store`` maps by name to (layout, this tile's blocks)."""

    def __init__(self, region: Region, tile: Region, store: dict, faults: FaultMap | None, spec):
        local = region.intersect(tile)
        if local is None:
            raise ValueError(f"the kernel's region {region} has no core in the tile {tile}")
        self.region, self.local, self.tile, self._store, self.spec = region, local, tile, store, spec
        self.faults = faults or FaultMap()
        # (rows, cols) bytes free on this tile's cores of the region, besides the DSM tensors they hold (set by
        # the tile that runs the kernel; None: the whole SRAM): what a message or a stored block may take
        self.sram_free: np.ndarray | None = None

    # -- where am I ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of this tile's cores of the region: the first two axes of every kernel array.

        >>> from waferrt.core.spec import TINY
        >>> RegionView(Region(0, 0, 6, 4), Region(4, 0, 4, 4), {}, None, TINY).shape  # x 4..5 of a 6x4 region
        (4, 2)
        """
        return self.local.shape

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """(xs, ys): the mesh coordinates of this tile's cores of the region, x first as everywhere; each an
        int array shaped (rows, cols) like the kernel's arrays (``xs[r, c]`` is the x of the core at row r,
        col c).

        >>> from waferrt.core.spec import TINY
        >>> xs, ys = RegionView(Region(0, 0, 6, 4), Region(4, 2, 4, 4), {}, None, TINY).coords()
        >>> xs.tolist(), ys.tolist()
        ([[4, 5], [4, 5]], [[2, 2], [3, 3]])
        """
        ys, xs = np.mgrid[self.local.y0:self.local.y1, self.local.x0:self.local.x1]
        return xs, ys

    def positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(xs, ys) counted from the region's North-West corner (``coords()`` minus (x0, y0)): each core's
        column and row in the region, x first; each an int array shaped (rows, cols).

        >>> from waferrt.core.spec import TINY
        >>> xs, ys = RegionView(Region(2, 1, 4, 3), Region(4, 0, 4, 4), {}, None, TINY).positions()
        >>> xs.tolist(), ys.tolist()
        ([[2, 3], [2, 3], [2, 3]], [[0, 0], [1, 1], [2, 2]])
        """
        xs, ys = self.coords()
        return xs - self.region.x0, ys - self.region.y0

    # -- what is dead ---------------------------------------------------------------------------------
    @property
    def dead_cores(self) -> frozenset[Coord]:
        """The dead cores of the kernel's region (the same on every tile: the map as the command started).

        >>> from waferrt.core.spec import TINY
        >>> v = RegionView(Region(0, 0, 4, 4), Region(0, 0, 4, 4), {}, FaultMap(frozenset({Coord(1, 2)})), TINY)
        >>> sorted(v.dead_cores), v.alive((1, 2)), v.alive(Coord(0, 0))
        ([Coord(x=1, y=2)], False, True)
        """
        return frozenset(self.faults.in_region(self.region))

    @property
    def dead_links(self) -> frozenset[tuple[Coord, Coord]]:
        """The dead links between two cores of the kernel's region, each as (a, b) with a < b.

        >>> from waferrt.core.spec import TINY
        >>> dead = FaultMap(links=frozenset({frozenset({Coord(2, 1), Coord(1, 1)})}))
        >>> sorted(RegionView(Region(0, 0, 4, 4), Region(0, 0, 4, 4), {}, dead, TINY).dead_links)
        [(Coord(x=1, y=1), Coord(x=2, y=1))]
        """
        return frozenset(self.faults.region_links(self.region, "x") + self.faults.region_links(self.region, "y"))

    def alive(self, c) -> bool:
        """Is core `c` ((x, y)) alive? A core outside the region is asked about all the same.

        >>> from waferrt.core.spec import TINY
        >>> v = RegionView(Region(0, 0, 2, 2), Region(0, 0, 2, 2), {}, FaultMap(frozenset({Coord(9, 9)})), TINY)
        >>> v.alive((9, 9)), v.alive((0, 1))
        (False, True)
        """
        return self.faults.alive(Coord(*c))

    def link_alive(self, a, b) -> bool:
        """Is the link between neighbouring cores `a` and `b` ((x, y) each) alive? (Links work both ways.)

        >>> from waferrt.core.spec import TINY
        >>> dead = FaultMap(links=frozenset({frozenset({Coord(1, 1), Coord(2, 1)})}))
        >>> v = RegionView(Region(0, 0, 4, 4), Region(0, 0, 4, 4), {}, dead, TINY)
        >>> v.link_alive((2, 1), (1, 1)), v.link_alive((1, 1), (1, 2))
        (False, True)
        """
        return self.faults.link_alive(Coord(*a), Coord(*b))

    @property
    def live(self) -> np.ndarray:
        """(rows, cols) bool: which of this tile's cores are alive (``where=ctx.live`` leaves the dead out).

        >>> from waferrt.core.spec import TINY
        >>> v = RegionView(Region(0, 0, 3, 2), Region(0, 0, 3, 2), {}, FaultMap(frozenset({Coord(2, 0)})), TINY)
        >>> v.live.astype(int).tolist()                      # [row][col]: core (x=2, y=0) is row 0, col 2
        [[1, 1, 0], [1, 1, 1]]
        """
        dead = np.zeros(self.shape, bool)
        for c in self.faults.in_region(self.local):
            dead[c.y - self.local.y0, c.x - self.local.x0] = True
        return ~dead

    def can_send(self, dx: int, dy: int) -> np.ndarray:
        """(rows, cols) bool: the cores that may send one hop (dx, dy) -- alive, their receiver inside the
        region and alive, the link between them alive: ``ctx.send(buf, dx, dy, where=ctx.can_send(dx, dy))``
        never needs a dead core or link.

        >>> from waferrt.core.spec import TINY
        >>> v = RegionView(Region(0, 0, 3, 1), Region(0, 0, 3, 1), {}, FaultMap(frozenset({Coord(2, 0)})), TINY)
        >>> v.can_send(1, 0).tolist(), v.can_send(-1, 0).tolist()   # east: (1,0) -> the dead (2,0) may not
        ([[True, False, False]], [[False, True, False]])
        """
        xs, ys = self.coords()
        ok = np.zeros(self.shape, bool)
        for (r, c), x in np.ndenumerate(xs):
            a, b = Coord(int(x), int(ys[r, c])), Coord(int(x) + dx, int(ys[r, c]) + dy)
            ok[r, c] = (self.region.contains(b) and self.faults.alive(a) and self.faults.alive(b)
                        and self.faults.link_alive(a, b))
        return ok

    # -- checks ---------------------------------------------------------------------------------------
    def _need(self, what: str, cores=None, axis: str | None = None, links=()) -> None:
        """Raise CoreFailed / LinkFailed if the primitive `what` needs a dead core or link: `cores` (default:
        every core of the region), the dead links along `axis` in the region, and `links`."""
        if not self.faults:
            return
        cores = self.region.cores() if cores is None else cores
        along = self.faults.region_links(self.region, axis) if axis else []
        dead = self.faults.hit(cores, [*along, *links])
        if dead is not None:
            raise self.faults.error(dead, f"needed by {what} in the kernel's region {self.region}; leave the dead "
                                          "out: ctx.live, ctx.can_send, ctx.dead_cores, where=")

    def _chosen(self, where) -> list[Coord]:
        """This tile's cores where `where` ((rows, cols) bool) holds."""
        where = np.asarray(where, bool)
        if where.shape != self.shape:
            raise ValueError(f"where= is a (rows, cols) bool array over this tile's cores {self.shape}, got "
                             f"shape {where.shape}; build it from ctx.live, ctx.can_send or ctx.coords()")
        rows, cols = np.nonzero(where)
        return [Coord(self.local.x0 + int(c), self.local.y0 + int(r)) for r, c in zip(rows, cols)]

    def _check(self, buf: np.ndarray, what: str, resident: bool = False) -> None:
        """`buf` starts with this tile's core axes, and one core's block of it fits in what a core has free
        beside its DSM tensors (`resident`: a block read from them, in the whole SRAM)."""
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"{what} takes a numpy array (rows, cols, *block) over this tile's cores, got "
                            f"{type(buf).__name__}")
        if buf.shape[:2] != self.shape:
            raise ValueError(f"{what}: kernel arrays start with this tile's core axes (rows, cols) = {self.shape}, "
                             f"got shape {buf.shape}")
        block = buf.itemsize * int(np.prod(buf.shape[2:], dtype=np.int64))
        free = self.spec.sram_bytes if self.sram_free is None or resident else int(self.sram_free.min())
        if block > free:
            site = user_site()
            held = "" if free == self.spec.sram_bytes else (
                f"; its DSM tensors already hold {self.spec.sram_bytes - free:,} of its {self.spec.sram_bytes:,} bytes")
            raise BlockTooLarge(
                f"{what}{f' at {site}' if site else ''}: each core's block of this array is {block:,} bytes "
                f"({buf.shape[2:]} {buf.dtype}), more than the {free:,} bytes a core has free on {self.spec.name}"
                f"{held}; rule: a core holds, sends and receives only what fits in its SRAM beside what it holds. "
                "Cut the block into pieces that fit and move them one after the other, or free a DSM tensor")

    def _spread(self, where, like: np.ndarray) -> np.ndarray:
        """`where` ((rows, cols) bool) shaped to broadcast over the blocks of `like`."""
        return np.reshape(np.asarray(where, bool), self.shape + (1,) * (like.ndim - 2))

    # -- DSM ------------------------------------------------------------------------------------------
    def load(self, name: str, where=None) -> np.ndarray:
        """This tile's blocks of DSM tensor `name` that lie in the kernel's region: (rows, cols, *block), a
        copy. With `where` ((rows, cols) bool), only those cores read theirs; the others' blocks are zeros
        (the way to read around a dead core, whose block is lost: ``where=ctx.live``). Free: a core reads
        its own SRAM.

        >>> from waferrt.core.layout import Layout
        >>> from waferrt.core.spec import TINY
        >>> region = Region(0, 0, 2, 1)                        # two cores, a block of 3 values each
        >>> store = {"x": (Layout((1, 2, 3), region, ("y", "x", None)), np.arange(6.0).reshape(1, 2, 1, 1, 3))}
        >>> v = RegionView(region, region, store, None, TINY)
        >>> v.load("x")[0, 1].ravel().tolist(), v.load("x", where=[[True, False]])[0, 1].ravel().tolist()
        ([3.0, 4.0, 5.0], [0.0, 0.0, 0.0])
        """
        layout, blocks = self._dsm(name)
        mine = blocks[self._window(layout.region)].copy()
        if where is None:
            self._need(f"ctx.load of {name!r}")
            return mine
        self._need(f"ctx.load of {name!r} (where=)", self._chosen(where))
        return np.where(self._spread(where, mine), mine, np.zeros((), mine.dtype))

    def store(self, name: str, value: np.ndarray, where=None) -> None:
        """Write this tile's blocks of DSM tensor `name` (only those of the cores where `where` holds, if
        given): `value` is (rows, cols, *block), the shape ``load(name)`` returns. Free.

        >>> from waferrt.core.layout import Layout
        >>> from waferrt.core.spec import TINY
        >>> region = Region(0, 0, 2, 1)
        >>> store = {"x": (Layout((1, 2, 3), region, ("y", "x", None)), np.arange(6.0).reshape(1, 2, 1, 1, 3))}
        >>> v = RegionView(region, region, store, None, TINY)
        >>> v.store("x", v.load("x") * 10, where=[[False, True]])   # only the East core writes
        >>> store["x"][1].reshape(2, 3).tolist()
        [[0.0, 1.0, 2.0], [30.0, 40.0, 50.0]]
        """
        layout, blocks = self._dsm(name)
        win = self._window(layout.region)
        if np.shape(value) != blocks[win].shape:
            raise ValueError(f"storing {np.shape(value)} into {name!r}, whose blocks here are {blocks[win].shape} "
                             "(rows, cols, *block)")
        if where is None:
            self._need(f"ctx.store into {name!r}")
            blocks[win] = value
            return
        self._need(f"ctx.store into {name!r} (where=)", self._chosen(where))
        blocks[win] = np.where(self._spread(where, value), value, blocks[win])

    def _dsm(self, name: str):
        try:
            return self._store[name]
        except KeyError:
            raise KeyError(f"no DSM tensor {name!r} on this tile; allocate it with wafer.dsm.alloc (tensors here: "
                           f"{sorted(self._store) or 'none'})") from None

    def _window(self, tensor_region: Region) -> tuple[slice, slice]:
        """The kernel's local cores as a window into the tensor's blocks on this tile (the tensor's region
        must cover the kernel's cores here)."""
        t_local = tensor_region.intersect(self.tile)
        if t_local is None or not t_local.covers(self.local):
            raise ValueError(f"the kernel's region {self.region} is not inside the tensor's region {tensor_region}")
        return t_local.window(self.local)
