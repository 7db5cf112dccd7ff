"""Mesh geometry: cores, directions, rectangles of cores, and the cutting of a mesh into tiles.

Contract: :class:`Coord`, :class:`Extent`, :class:`Region`, :class:`TileId` and :class:`MeshSpec` are frozen, hashable
values (usable as dict keys, comparable, picklable). x grows to the East, y to the South; core (0, 0) is
the North-West corner.

The one convention for axes (docs/PROGRAMMING.md, "Axes"): a core, a mesh, a tile and a region's size are
given x first -- ``Coord(x, y)``, ``mesh=(width, height)`` = (cols, rows), ``Region(x0, y0, w, h)``,
``TileId(tx, ty)`` -- and written so (``(x=3, y=4)``; a region ``[x0:x1)x[y0:y1)``); an array over cores is
indexed the numpy way, rows first -- ``a[y, x]``, shape (rows, cols) = (h, w) -- and a place in it is
written ``[row 4, col 3]``. A mesh of W x H cores is cut into tiles of tw x th cores (the last column/row of
tiles is narrower/shorter when tw/th do not divide W/H). Pure: no numpy arrays of data, no Ray.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from .arith import cdiv, whole

DEFAULT_MAX_TILES = 256  # tile actors a Wafer starts unless told otherwise: each is a Ray worker of ~90 MB


class Dir(enum.Enum):
    """The four links of a core. ``value`` is the (dx, dy) of one hop."""

    N = (0, -1)
    E = (1, 0)
    S = (0, 1)
    W = (-1, 0)

    __hash__ = object.__hash__  # members are singletons: identity hash, in C (dict keys on the fabric's hot path)

    @property
    def opposite(self) -> Dir:
        return _OPPOSITE[self]

    @classmethod
    def of_step(cls, dx: int, dy: int) -> Dir:
        for d in cls:
            if d.value == (dx, dy):
                return d
        raise ValueError(f"({dx}, {dy}) is not one hop: only N/E/S/W neighbour hops exist")


_OPPOSITE = {Dir.N: Dir.S, Dir.S: Dir.N, Dir.E: Dir.W, Dir.W: Dir.E}


class _XY(NamedTuple):
    x: int
    y: int


class Coord(_XY):
    """A core's place on the mesh: x its column (growing East), y its row (growing South); (0, 0) is the
    North-West corner. A tuple: ``Coord(3, 4) == (3, 4)``, ``x, y = c``, hashable; written ``(x=3, y=4)``.
    Arrays over cores are indexed the other way round, ``a[y, x]`` (rows, cols): see ``Region.local``."""

    __slots__ = ()

    def __new__(cls, x: int, y: int) -> Coord:
        if type(x) is not int or type(y) is not int:  # the common case costs two type checks
            x, y = whole("Coord.x", x, least=None), whole("Coord.y", y, least=None)
        return super().__new__(cls, x, y)

    def step(self, d: Dir) -> Coord:
        return Coord(self.x + d.value[0], self.y + d.value[1])

    def hops_to(self, other: Coord) -> int:
        """Manhattan distance: the number of hops a message needs on the mesh."""
        return abs(self.x - other.x) + abs(self.y - other.y)

    def __str__(self) -> str:
        return f"(x={self.x}, y={self.y})"


class _WH(NamedTuple):
    width: int
    height: int


class Extent(_WH):
    """A size in cores, x first: ``Extent(width, height)`` = (cols, rows) -- a mesh's, a tile's, a grid's.
    A tuple, as :class:`Coord` is (``Extent(4, 2) == (4, 2)``, hashable, written ``4x2``), so that a value
    read from a flag or a saved plan converts once, ``Extent(*mesh)``, and is reached by name after."""

    __slots__ = ()

    def __new__(cls, width: int, height: int) -> Extent:
        if type(width) is not int or type(height) is not int:
            width, height = whole("Extent.width", width, least=None), whole("Extent.height", height, least=None)
        return super().__new__(cls, width, height)

    @property
    def cores(self) -> int:
        return self.width * self.height

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True, order=True)
class Region:
    """A rectangle of cores: x in [x0, x0+w), y in [y0, y0+h)."""

    x0: int
    y0: int
    w: int
    h: int

    def __post_init__(self) -> None:
        for name in ("x0", "y0", "w", "h"):
            if type(getattr(self, name)) is not int:  # the planner makes millions of regions of plain ints
                whole(f"Region.{name}", getattr(self, name), least=None)
        if self.w < 1 or self.h < 1:
            raise ValueError(f"a region needs at least 1x1 cores, got {self.w}x{self.h}")
        if self.x0 < 0 or self.y0 < 0:
            raise ValueError(f"a region starts at a core with x, y >= 0, got ({self.x0},{self.y0})")

    @property
    def x1(self) -> int:
        return self.x0 + self.w

    @property
    def y1(self) -> int:
        return self.y0 + self.h

    @property
    def size(self) -> int:
        return self.w * self.h

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) = (h, w): the order of the core axes of arrays over this region."""
        return (self.h, self.w)

    def contains(self, c: Coord) -> bool:
        return self.x0 <= c.x < self.x1 and self.y0 <= c.y < self.y1

    def covers(self, other: Region) -> bool:
        return self.x0 <= other.x0 and self.y0 <= other.y0 and other.x1 <= self.x1 and other.y1 <= self.y1

    def intersect(self, other: Region) -> Region | None:
        x0, y0 = max(self.x0, other.x0), max(self.y0, other.y0)
        x1, y1 = min(self.x1, other.x1), min(self.y1, other.y1)
        if x1 <= x0 or y1 <= y0:
            return None
        return Region(x0, y0, x1 - x0, y1 - y0)

    def cores(self) -> Iterator[Coord]:
        for y in range(self.y0, self.y1):
            for x in range(self.x0, self.x1):
                yield Coord(x, y)

    def touches(self, other: Region) -> bool:
        """True when some core of self is one hop from some core of other (and they do not overlap)."""
        if self.intersect(other) is not None:
            return False
        x_overlap = self.x0 < other.x1 and other.x0 < self.x1
        y_overlap = self.y0 < other.y1 and other.y0 < self.y1
        return (x_overlap and (self.y1 == other.y0 or other.y1 == self.y0)) or (
            y_overlap and (self.x1 == other.x0 or other.x1 == self.x0)
        )

    def local(self, c: Coord) -> tuple[int, int]:
        """(row, col) of core c inside this region."""
        return (c.y - self.y0, c.x - self.x0)

    def window(self, inner: Region) -> tuple[slice, slice]:
        """The cores of `inner` (which this region covers) as (row, col) slices into arrays over this
        region's (rows, cols): the one place that cuts a sub-rectangle out of per-core arrays."""
        if not self.covers(inner):
            raise ValueError(f"region {inner} is not inside {self}")
        r0, c0 = inner.y0 - self.y0, inner.x0 - self.x0
        return slice(r0, r0 + inner.h), slice(c0, c0 + inner.w)

    def hops_to(self, other: Region) -> int:
        """Hops between the nearest cores of two regions (1 when they touch, 0 when they overlap)."""
        dx = max(0, self.x0 - (other.x1 - 1), other.x0 - (self.x1 - 1))
        dy = max(0, self.y0 - (other.y1 - 1), other.y0 - (self.y1 - 1))
        return dx + dy

    def __str__(self) -> str:
        return f"[{self.x0}:{self.x1})x[{self.y0}:{self.y1})"


@dataclass(frozen=True, order=True)
class TileId:
    """Tile column tx, tile row ty in the grid of tiles."""

    tx: int
    ty: int

    def __str__(self) -> str:
        return f"tile({self.tx},{self.ty})"


@dataclass(frozen=True)
class MeshSpec:
    """The emulated mesh: W x H cores cut into tiles of tw x th cores, some cores possibly dead."""

    width: int
    height: int
    tile_w: int
    tile_h: int
    dead: frozenset[Coord] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in ("width", "height", "tile_w", "tile_h"):
            whole(f"MeshSpec.{name}", getattr(self, name), least=None)
        if self.width < 1 or self.height < 1:
            raise ValueError(f"a mesh needs at least 1x1 cores, got {self.width}x{self.height}")
        if self.tile_w < 1 or self.tile_h < 1:
            raise ValueError(f"a tile needs at least 1x1 cores, got {self.tile_w}x{self.tile_h}")
        if self.tile_w > self.width or self.tile_h > self.height:
            raise ValueError(
                f"tile {self.tile_w}x{self.tile_h} is larger than the mesh {self.width}x{self.height}; "
                "pick a tile no larger than the mesh"
            )
        object.__setattr__(self, "dead", frozenset(self.dead))
        for c in self.dead:
            if not self.region.contains(c):
                raise ValueError(f"dead core {c} is outside the {self.width}x{self.height} mesh")

    @classmethod
    def tiled(cls, grid: Extent, tile: Extent) -> MeshSpec:
        """A healthy mesh of `grid` (across x down) whole tiles of `tile` cores."""
        return cls(grid.width * tile.width, grid.height * tile.height, tile.width, tile.height)

    @property
    def region(self) -> Region:
        return Region(0, 0, self.width, self.height)

    @property
    def tile(self) -> Extent:
        """A tile's size in cores (tile_w, tile_h); the last column/row of tiles may be narrower/shorter."""
        return Extent(self.tile_w, self.tile_h)

    @property
    def tiles_x(self) -> int:
        return cdiv(self.width, self.tile_w)

    @property
    def tiles_y(self) -> int:
        return cdiv(self.height, self.tile_h)

    def tiles(self) -> list[TileId]:
        return [TileId(tx, ty) for ty in range(self.tiles_y) for tx in range(self.tiles_x)]

    def in_tiles(self, most: int) -> MeshSpec:
        """The same mesh cut into at most `most` tiles: neighbouring tiles merged, two at a time along the
        axis with more of them (rows first on a tie), so every old tile -- and every region inside one --
        lies inside one new tile. E.g. 2x2 tiles of 87x64 in at most 2: 2x1 tiles of 87x128."""
        mesh = self
        while mesh.tiles_x * mesh.tiles_y > max(1, most):
            if mesh.tiles_y >= mesh.tiles_x:
                mesh = replace(mesh, tile_h=min(2 * mesh.tile_h, mesh.height))
            else:
                mesh = replace(mesh, tile_w=min(2 * mesh.tile_w, mesh.width))
        return mesh

    def tile_region(self, t: TileId) -> Region:
        if not (0 <= t.tx < self.tiles_x and 0 <= t.ty < self.tiles_y):
            raise ValueError(f"{t} is outside the {self.tiles_x}x{self.tiles_y} grid of tiles")
        x0, y0 = t.tx * self.tile_w, t.ty * self.tile_h
        return Region(x0, y0, min(self.tile_w, self.width - x0), min(self.tile_h, self.height - y0))

    def tile_of(self, c: Coord) -> TileId:
        if not self.region.contains(c):
            raise ValueError(f"core {c} is outside the {self.width}x{self.height} mesh")
        return TileId(c.x // self.tile_w, c.y // self.tile_h)

    def tile_neighbour(self, t: TileId, d: Dir) -> TileId | None:
        tx, ty = t.tx + d.value[0], t.ty + d.value[1]
        if 0 <= tx < self.tiles_x and 0 <= ty < self.tiles_y:
            return TileId(tx, ty)
        return None

    def tiles_of(self, r: Region) -> list[TileId]:
        """The tiles that hold at least one core of region r."""
        return [t for t in self.tiles() if self.tile_region(t).intersect(r) is not None]

    def with_dead(self, cores) -> MeshSpec:
        return MeshSpec(self.width, self.height, self.tile_w, self.tile_h, self.dead | frozenset(cores))

    def __str__(self) -> str:
        dead = f", {len(self.dead)} dead" if self.dead else ""
        tiles = f"{self.tiles_x}x{self.tiles_y} tiles of {self.tile_w}x{self.tile_h}"
        return f"{self.width}x{self.height} cores in {tiles}{dead}"


class MeshTooLarge(ValueError):
    """A mesh wider or taller than the whole wafer its hardware spec describes."""


class TooManyTiles(ValueError):
    """A mesh cut into more tiles (one Ray actor process each) than the limit allows."""


def wafer_grid(spec, tile: Extent) -> Extent:
    """The most tiles across and down of a mesh on the wafer of `spec` (a HardwareSpec): whole tiles that
    cover it (the last column or row of tiles may overhang the wafer's edge by less than one tile)."""
    return Extent(cdiv(spec.full_mesh.width, tile.width), cdiv(spec.full_mesh.height, tile.height))


def check_on_wafer(mesh: MeshSpec, spec) -> None:
    """Raise :class:`MeshTooLarge` unless `mesh` lies on the full wafer of `spec` (a HardwareSpec): its tiles
    no larger than the wafer, at most ``wafer_grid`` of them across and down."""
    (fw, fh), (nx, ny) = spec.full_mesh, wafer_grid(spec, mesh.tile)
    if mesh.tile_w > fw or mesh.tile_h > fh or mesh.tiles_x > nx or mesh.tiles_y > ny:
        raise MeshTooLarge(
            f"a {mesh.width}x{mesh.height} mesh does not fit on the {spec.name} wafer, which has {fw}x{fh} "
            f"cores: use a mesh of at most {fw}x{fh} cores (or a spec with a larger wafer)")


def check_tile_count(mesh: MeshSpec, max_tiles: int = DEFAULT_MAX_TILES) -> None:
    """Raise :class:`TooManyTiles` when `mesh` has more than `max_tiles` tiles, suggesting a tile size
    that stays within the limit."""
    n, limit = mesh.tiles_x * mesh.tiles_y, whole("max_tiles", max_tiles)
    if n <= limit:
        return
    k = max(1, int(limit ** 0.5))
    tw, th = cdiv(mesh.width, min(k, mesh.width)), cdiv(mesh.height, min(k, mesh.height))
    fit = cdiv(mesh.width, tw) * cdiv(mesh.height, th)
    raise TooManyTiles(
        f"{mesh} is {n:,} tile actors, each a Ray worker process (~90 MB), more than the limit of {limit}: "
        f"use larger tiles, e.g. {tw}x{th} cores ({fit} tiles), or raise the limit to {n} (max_tiles={n}; "
        f"--max-tiles {n} on the command line) if you mean it")
