"""The die grid's links under TEMP's tensor-stream partition: which die-to-die link carries what, and for how long.

Contract (pure): :class:`Layout` names how the partition's groups are placed on the dies; ``partition(grid,
layout)`` is the :class:`Partition` -- its gather rings and reduce rings as tuples of die coordinates, in the
order each ring visits them -- or None where the layout does not exist on the grid; ``link_loads(grid, rings)``
routes every ring hop over the die grid (``core.topology.Topology.route``: the row first, then the column; a
torus template wraps its rows and columns of dies too) and returns the bytes each directed die edge carries
per byte of a ring's data; ``stream_traffic(config, tokens, dtype, passes)`` is a step's
:class:`StreamTraffic` and ``stream_d2d(template, traffic)`` prices it under every layout (:class:`LinkTime`:
the busiest edge's bytes over its rate plus every ring step's crossings).

The partition (TEMP, Wang et al., HPCA 2026, arXiv:2512.14256; its mechanism as its abstract names it --
topology-aware tensor-stream partition, traffic-conscious mapping -- the details below are this model's):
a GEMM X[T, K] W[K, N] on a gather x reduce grid of dies, every die holding a K/reduce x N/gather block of W
(no copy). Forward: each gather ring all-gathers its K/reduce slice of X, each reduce ring reduce-scatters its
N/gather slice of the partial Y. Backward: dY gathered over the reduce ring, the partial dX reduce-scattered
over the gather ring and X gathered again for dW (TSPP keeps no gathered copy) -- 3 passes of X's bytes over
the gather rings, 2 of Y's over the reduce rings. One ring of all the dies (reduce = 1) has no reduce ring.

A ring of n dies carrying R bytes runs both ways, half each (ASSUMED, as a bidirectional ring): every hop
carries (n-1)/n x R/2 in each direction. On a line of dies without a wrap both closing hops run back over
the line, so every edge carries (n-1)/n x R one way: a torus halves it. Every hop crosses its route's edges
(a ring laid out row-major ignoring the grid shares edges: contention). ASSUMED: the streams of successive
GEMMs and layers overlap, so the step's die-to-die time is the busiest edge's bytes at ``DieLinks.bytes_per_s``
plus, for every collective, (n-1) ring steps of its longest hop's crossings at ``DieLinks.latency_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from waferrt.core.dtypes import itemsize
from waferrt.core.mesh import Coord, Extent
from waferrt.core.template import WaferTemplate
from waferrt.core.topology import MESH, Topology
from waferrt.model.config import LlamaConfig

Ring = tuple[Coord, ...]  # dies in the order the ring visits them: x a die's column, y its row
TORUS = Topology("torus")


class Axis(Enum):
    ROW = "row"
    COLUMN = "column"


@dataclass(frozen=True)
class DieEdge:
    """One directed die-to-die link: on row (or column) `line` of the grid, `link` the topology's (from, to)
    positions along it (``Topology.route``'s own naming of a link)."""

    axis: Axis
    line: int
    link: tuple


class Layout(Enum):
    """How the partition's groups sit on the die grid (its value: what the tables print)."""

    RING_ROW_MAJOR = "one ring, dies row by row"
    RING_CYCLE = "one ring, a cycle of neighbours"
    GRID_ROW_MAJOR = "2D, groups row by row"
    GRID_ROWS = "2D, gather on die rows"
    GRID_COLUMNS = "2D, gather on die columns"

    @property
    def aware(self) -> bool:
        """Is this layout TEMP's topology-aware, traffic-conscious mapping (rings of neighbouring dies)?"""
        return self not in (Layout.RING_ROW_MAJOR, Layout.GRID_ROW_MAJOR)


@dataclass(frozen=True)
class DieGrid:
    """`dies` (columns, rows) of dies, their edges routed over `topology` (a torus wraps every row and column)."""

    dies: Extent
    topology: Topology = MESH

    @staticmethod
    def of(template: WaferTemplate) -> DieGrid:
        """The template's die grid: a torus template's dies wrap too (ASSUMED); any other routes as the mesh
        (the mesh-switch's switch is the die's own)."""
        return DieGrid(Extent(*template.dies), TORUS if template.die.topology == TORUS else MESH)

    def route(self, src: Coord, dst: Coord) -> list[DieEdge]:
        """The directed die edges a message from `src` to `dst` crosses: along src's row, then dst's column."""
        along = self.topology.route(self.dies.width, src.x, dst.x) if src.x != dst.x else []
        down = self.topology.route(self.dies.height, src.y, dst.y) if src.y != dst.y else []
        return [DieEdge(Axis.ROW, src.y, link) for link in along] + [DieEdge(Axis.COLUMN, dst.x, link) for link in down]


@dataclass(frozen=True)
class Partition:
    layout: Layout
    gather: tuple[Ring, ...]
    reduce: tuple[Ring, ...]  # rings of one die when the partition is one ring (nothing to reduce)


@dataclass(frozen=True)
class StreamTraffic:
    """A step's bytes if every die were one ring: X's (3 passes of every GEMM input) and Y's (2 passes of every
    GEMM output), and how many collectives of each kind the step runs."""

    x_bytes: float
    y_bytes: float
    x_collectives: int
    y_collectives: int


def stream_traffic(config: LlamaConfig, tokens: int, dtype: str, passes: int) -> StreamTraffic:
    """A tensor-stream step's bytes over the dies as if they were one ring: `tokens` through every layer's GEMM
    inputs (q/k/v's, o's, gate/up's shared, down's) 3 times and their outputs twice, at `dtype`; 4 GEMMs a
    layer, each of the `passes`."""
    e, layers = itemsize(dtype), config.n_layers
    inputs = 3 * config.dim + config.dense_hidden  # q/k/v, o, gate and up, down
    outputs = 3 * config.dim + 2 * config.kv_dim + 2 * config.dense_hidden
    gemms = 4 * layers * passes
    return StreamTraffic(3 * layers * tokens * inputs * e, 2 * layers * tokens * outputs * e, 3 * gemms, 2 * gemms)


@dataclass(frozen=True)
class LinkTime:
    """A layout's die-to-die time: the busiest edge's `busiest_bytes`, the longest ring hop in crossings, and
    the seconds (bytes at the edge's rate plus the rings' crossings)."""

    partition: Partition
    busiest_bytes: float
    longest_hop: int
    seconds: float

    def label(self) -> str:
        g, r = len(self.partition.gather[0]), len(self.partition.reduce[0])
        return f"{self.partition.layout.value} ({r}x{g})"


def _line(grid: DieGrid, n: int) -> tuple[int, ...]:
    return grid.topology.ring_order(n)


def _cycle(dx: int, dy: int) -> Ring | None:
    """A ring of every die, each hop to a neighbour (rows snaking over columns 1.., back up column 0): exists
    when the rows are even in number (or transposed); None when both sides are odd."""
    if dy % 2 == 0 and dx >= 2:
        snake = [Coord(x if y % 2 == 0 else dx - x, y) for y in range(dy) for x in range(1, dx)]
        return (Coord(0, 0),) + tuple(snake) + tuple(Coord(0, y) for y in range(dy - 1, 0, -1))
    if dx % 2 == 0 and dy >= 2:
        return tuple(Coord(c.y, c.x) for c in _cycle(dy, dx))
    return None


def partition(grid: DieGrid, layout: Layout) -> Partition | None:
    """The rings of `layout` on `grid`, or None where it does not exist (one die; a cycle on odd x odd dies; a
    2D grid on a line of dies)."""
    dx, dy, n = grid.dies.width, grid.dies.height, grid.dies.cores
    alone = tuple((Coord(x, y),) for y in range(dy) for x in range(dx))
    if n < 2:
        return None
    if layout is Layout.RING_ROW_MAJOR:
        return Partition(layout, (tuple(Coord(x, y) for y in range(dy) for x in range(dx)),), alone)
    if layout is Layout.RING_CYCLE:
        if 1 in grid.dies:  # a line of dies: its folded ring (torus: the line itself)
            line = [Coord(x, 0) for x in _line(grid, dx)] if dy == 1 else [Coord(0, y) for y in _line(grid, dy)]
            return Partition(layout, (tuple(line),), alone)
        cycle = _cycle(dx, dy)
        return Partition(layout, (cycle,), alone) if cycle else None
    if 1 in grid.dies:
        return None
    rows = tuple(tuple(Coord(x, y) for x in _line(grid, dx)) for y in range(dy))
    cols = tuple(tuple(Coord(x, y) for y in _line(grid, dy)) for x in range(dx))
    if layout is Layout.GRID_ROWS:
        return Partition(layout, rows, cols)
    if layout is Layout.GRID_COLUMNS:
        return Partition(layout, cols, rows)
    place = [Coord(i % dx, i // dx) for i in range(n)]  # GRID_ROW_MAJOR: groups of dy dies laid out row by row
    gather = tuple(tuple(place[r * dy + j] for j in range(dy)) for r in range(dx))
    return Partition(layout, gather, tuple(tuple(place[c + r * dy] for r in range(dx)) for c in range(dy)))


@lru_cache(maxsize=256)
def link_loads(grid: DieGrid, rings: tuple[Ring, ...]) -> tuple[dict, int]:
    """(bytes each directed die edge carries per byte of data in each ring, the longest hop in crossings):
    each ring of n dies runs both ways, every hop carrying (n-1)/n x 1/2 of its data in each."""
    loads: dict[tuple, float] = {}
    longest = 0
    for ring in rings:
        n = len(ring)
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            if n < 2:
                continue
            for src, dst in ((a, b), (b, a)):
                route = grid.route(src, dst)
                longest = max(longest, len(route))
                for edge in route:
                    loads[edge] = loads.get(edge, 0.0) + (n - 1) / n / 2
    return loads, longest


def link_time(template: WaferTemplate, part: Partition, traffic: StreamTraffic) -> LinkTime:
    """The die-to-die time of a step's `traffic` under `part` (module docstring)."""
    grid, links = DieGrid.of(template), template.d2d
    g, r = len(part.gather[0]), len(part.reduce[0])
    gather, g_hop = link_loads(grid, part.gather)
    reduce, r_hop = link_loads(grid, part.reduce)
    x_ring, y_ring = traffic.x_bytes / r, traffic.y_bytes / g  # each gather ring: its K/r slice of X, etc.
    busiest = max(x_ring * gather.get(e, 0.0) + y_ring * reduce.get(e, 0.0) for e in set(gather) | set(reduce))
    crossings = traffic.x_collectives * (g - 1) * g_hop + traffic.y_collectives * (r - 1) * r_hop
    return LinkTime(part, busiest, max(g_hop, r_hop), busiest / links.bytes_per_s + crossings * links.latency_s)


def stream_d2d(template: WaferTemplate, traffic: StreamTraffic) -> tuple[LinkTime, ...]:
    """Every layout that exists on the template's die grid, priced (empty on one die)."""
    if template.n_dies == 1 or template.d2d is None:
        return ()
    grid = DieGrid.of(template)
    parts = (partition(grid, layout) for layout in Layout)
    return tuple(link_time(template, p, traffic) for p in parts if p is not None)
