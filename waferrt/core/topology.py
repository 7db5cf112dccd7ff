"""Topologies of the network on the wafer: which links exist between cores, and the route a message takes.

Contract: :class:`Topology` is a frozen value a :class:`~waferrt.core.spec.HardwareSpec` carries (default:
the 2D mesh, so every figure of the mesh is unchanged). Routing is along one line of cores (a row or a
column; every collective of waferrt runs along lines), positions 0..n-1:

- ``mesh``: links only between neighbours; a message from a to b takes |a-b| hops.
- ``torus``: the mesh plus a wrap link joining the two end cores of every whole line of the wafer; a message
  takes the shorter way round, min(d, n-d) hops (d = |a-b|). A line that is not a whole line of the wafer
  (a region narrower than the wafer) has no wrap: it routes as the mesh (``on_line``).
- ``mesh-switch`` (NoW, "network on wafer": the mesh plus a switch layer for long-distance traffic): every
  ``group`` consecutive cores of a line share a port, their middle core, linked to the line's switch; a
  message goes port to port through the switch (two switch links) when that is fewer hops than the mesh.

``line_hops(n, a, b)`` is the one owner of a message's hops; ``step_hops(n, src, dist)`` of a routing stage
in which every core at `src` sends `dist` positions along the line (the longest of their routes); ``farthest``
of a multicast's reach; ``ring_order`` the ring an allreduce goes round (the folded ring on a mesh: logical
neighbours at most 2 hops apart; the line itself on a torus: every neighbour 1 hop, over the wrap at the end);
``route`` the links a message crosses (what a LineComm's link tap records, waferrt.fabric.line_links);
``link_exists`` answers whether a link joins two positions. The closed forms of core.cost read these; the
fabric (waferrt.fabric.comm) books the same. Pure: no numpy arrays, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

TOPOLOGIES = ("mesh", "torus", "mesh-switch")


class NoSuchLink(ValueError):
    """A message was to cross a link the topology does not have."""


@dataclass(frozen=True)
class LineCore:
    """A core of a line: its `position` on the line (0..n-1) and its `name` in an error (e.g. its Coord)."""

    position: int
    name: object


@dataclass(frozen=True)
class Topology:
    """`kind`: "mesh", "torus" or "mesh-switch"; `group`: cores of a line per switch port (mesh-switch only;
    NoW groups cores per switch port, the size here is ASSUMED, 16 by default: ~1/16 of the cores are ports)."""

    kind: str = "mesh"
    group: int = 16

    def __post_init__(self) -> None:
        if self.kind not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.kind!r}; choose one of {', '.join(TOPOLOGIES)}")
        if type(self.group) is not int or self.group < 2:
            raise ValueError(f"a mesh-switch needs at least 2 cores per switch port, got group={self.group!r}")

    def __str__(self) -> str:
        return f"mesh-switch/{self.group}" if self.kind == "mesh-switch" else self.kind

    def on_line(self, whole: bool) -> Topology:
        """The topology a line of cores routes over: a torus's line wraps only when it is a whole line of the
        wafer (`whole`); otherwise it is a mesh line."""
        return self if whole or self.kind != "torus" else MESH

    def port(self, a: int) -> int:
        """The switch port of position a (mesh-switch): the middle core of its group of `group` cores."""
        return (a // self.group) * self.group + self.group // 2

    def line_hops(self, n: int, a: int, b: int) -> int:
        """Hops a message takes from position a to position b of a line of n cores."""
        d = abs(a - b)
        if self.kind == "mesh":
            return d
        if self.kind == "torus":
            return min(d, n - d)
        pa, pb = min(self.port(a), n - 1), min(self.port(b), n - 1)
        return min(d, abs(a - pa) + 2 + abs(b - pb)) if pa != pb else d

    def step_hops(self, n: int, src, dist: int) -> int:
        """Hops of one routing stage in which every position of `src` sends `dist` positions along the line:
        the longest of their routes (all travel at once)."""
        if self.kind == "mesh" or not len(src):
            return abs(dist)
        return max(self.line_hops(n, int(s), int(s) + dist) for s in src)

    def farthest(self, n: int, root: int) -> int:
        """Hops from `root` to the core of its line farthest away: a multicast's reach."""
        if self.kind == "mesh":
            return max(root, n - 1 - root)
        if self.kind == "torus":
            return n // 2 if n > 1 else 0
        return max(self.line_hops(n, root, b) for b in range(n))

    def ring_order(self, n: int) -> tuple[int, ...]:
        """The positions in the order an allreduce's ring visits them: the line itself on a torus (the wrap
        closes it); otherwise the folded ring, evens going out and odds coming back."""
        if self.kind == "torus":
            return tuple(range(n))
        return tuple(range(0, n, 2)) + tuple(range(n - 1 if n % 2 == 0 else n - 2, 0, -2))

    def route(self, n: int, a: int, b: int) -> list[tuple]:
        """The directed links a message takes from position a to b of a line of n cores, in order: (from, to)
        positions -- a torus's wrap is (n-1, 0) or (0, n-1) -- and ("up", port) / ("down", port) for a switch
        link. The one owner of which links a message crosses (its length is ``line_hops``)."""
        d = b - a
        if self.kind == "torus" and n > 2 and (abs(d) > n - abs(d) or (2 * abs(d) == n and d < 0)):
            step = -1 if d > 0 else 1  # the shorter way round (a tie goes forward)
            return [(p % n, (p + step) % n) for p in range(a, a + step * (n - abs(d)), step)]
        if self.kind == "mesh-switch" and self.line_hops(n, a, b) < abs(d):
            pa, pb = min(self.port(a), n - 1), min(self.port(b), n - 1)
            return _mesh_route(a, pa) + [("up", pa), ("down", pb)] + _mesh_route(pb, b)
        return _mesh_route(a, b)

    def ring_hops(self, n: int) -> tuple[int, int]:
        """(longest, total) hops of one step of the ring (every position sends to its successor at once)."""
        return _ring_hops(self, n)

    def link_exists(self, n: int, a: int, b: int) -> bool:
        """Is there a link between positions a and b of a line of n cores (a wrap, a switch port pair)?"""
        d = abs(a - b)
        if d == 1:
            return True
        if self.kind == "torus":
            return n > 2 and d == n - 1
        return False

    def check_link(self, n: int, a: LineCore, b: LineCore) -> None:
        """Raise :class:`NoSuchLink` naming both cores unless a link of this topology joins `a` and `b`, two
        cores of a line of n."""
        if not self.link_exists(n, a.position, b.position):
            hint = ("build the Wafer with spec.replace(topology=Topology('torus')) and give the kernel a region "
                    "that spans the whole line" if self.kind != "torus" else
                    "a torus's wrap links join only the ends of a whole line of the wafer: give the kernel a "
                    "region as wide (or as tall) as the Wafer's mesh")
            raise NoSuchLink(f"core {a.name} has no link to core {b.name} on a {self} line of {n} cores; {hint}; or "
                             "move the block hop by hop (ctx.shift with wrap=True forwards it back along the line)")


@dataclass(frozen=True)
class LineLoad:
    """What an all-to-all along a line lays on its links, in chunks (one core's share for one other core):
    `busiest` -- on the most loaded directed link; `total` -- chunk-hops over every link; `diameter` -- the
    longest route, in hops."""

    busiest: int
    total: int
    diameter: int


def alltoall_load(topology: Topology, n: int) -> LineLoad:
    """Every core of a line of n sends one chunk to every other core, each by its route: the links' load.
    Mesh (the middle link carries every chunk that crosses it) and torus (shortest way round, a tie at n/2
    going forward, so each forward link carries sum(d for d <= n//2)) in closed form; a mesh-switch counted
    route by route (``routed_load``, which the closed forms are tested against)."""
    if n < 2:
        return LineLoad(0, 0, 0)
    if topology.kind == "mesh":
        return LineLoad((n // 2) * ((n + 1) // 2), (n ** 3 - n) // 3, n - 1)
    if topology.kind == "torus":
        m = n // 2
        return LineLoad(m * (m + 1) // 2, n * sum(min(d, n - d) for d in range(1, n)), m)
    return routed_load(topology, n)


@lru_cache(maxsize=64)
def routed_load(topology: Topology, n: int) -> LineLoad:
    """The all-to-all's load counted by routing every pair: mesh hops one by one, a torus the shorter way (a
    tie forward), a mesh-switch through its ports and the switch when ``line_hops`` takes it."""
    load: dict[tuple, int] = {}
    total = diameter = 0
    for a in range(n):
        for b in range(n):
            if a != b:
                route = topology.route(n, a, b)
                for link in route:
                    load[link] = load.get(link, 0) + 1
                total, diameter = total + len(route), max(diameter, len(route))
    return LineLoad(max(load.values()), total, diameter)


def _mesh_route(a: int, b: int) -> list[tuple]:
    step = 1 if b > a else -1
    return [(p, p + step) for p in range(a, b, step)]


@lru_cache(maxsize=512)
def _ring_hops(topology: Topology, n: int) -> tuple[int, int]:
    order = topology.ring_order(n)
    hops = [topology.line_hops(n, p, q) for p, q in zip(order, order[1:] + order[:1], strict=True)]
    return max(hops), sum(hops)


MESH = Topology()
