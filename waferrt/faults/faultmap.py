"""What is dead when a command starts: the fault map every core of a kernel sees alike, and what was lost.

Contract: a :class:`FaultMap` is a frozen value: the dead cores, the dead links (each a frozenset of its two
cores) and, per dead core, what its SRAM held (``lost``: the DSM blocks, named by :func:`lost_blocks`).
The runtime gathers it from the tiles of a kernel's region at the start of every command
(``FaultMap.join`` of the tiles' reports), so every tile of the command checks against the same map and
raises the same error at the same primitive (no tile is left waiting for another). ``hit(cores, links)``
is the first dead core among `cores`, else the first dead link among `links`, as a fault value; ``error``
turns it into :class:`~waferrt.faults.errors.CoreFailed` (naming the core and the DSM blocks it lost) or
:class:`~waferrt.faults.errors.LinkFailed` (naming both cores). A DSM block on a dead core is lost: it
cannot be read (the error names it): what was there, or is put there later, never comes back. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from waferrt.core.layout import Layout
from waferrt.core.mesh import Coord, Region

from .errors import CoreFailed, LinkFailed
from .model import CoreFailure, LinkFailure


@dataclass(frozen=True)
class FaultMap:
    cores: frozenset = frozenset()  # dead cores (Coord)
    links: frozenset = frozenset()  # dead links, each frozenset({a, b})
    lost: tuple = ()  # ((core, (what its SRAM held, ...)), ...) for the dead cores, in core order

    @classmethod
    def join(cls, reports: Iterable[dict]) -> FaultMap:
        """One map from the tiles' reports (``Tile.dead``: "cores", "links" as pairs of cores, "lost")."""
        cores, links, lost = set(), set(), {}
        for r in reports:
            cores |= set(r["cores"])
            links |= {frozenset(link) for link in r["links"]}
            lost.update({c: tuple(held) for c, held in r.get("lost", ())})
        return cls(frozenset(cores), frozenset(links), tuple(sorted(lost.items())))

    def __bool__(self) -> bool:
        return bool(self.cores or self.links)

    def alive(self, c: Coord) -> bool:
        return c not in self.cores

    def link_alive(self, a: Coord, b: Coord) -> bool:
        return frozenset((a, b)) not in self.links

    def held(self, c: Coord) -> tuple[str, ...]:
        """What the dead core `c`'s SRAM held (its DSM blocks), as far as the map knows."""
        return dict(self.lost).get(c, ())

    def in_region(self, region: Region) -> list[Coord]:
        """The dead cores inside `region`, in order."""
        return sorted(c for c in self.cores if region.contains(c))

    def hit(self, cores: Iterable[Coord] = (), links: Iterable[tuple[Coord, Coord]] = ()
            ) -> CoreFailure | LinkFailure | None:
        """The first dead core among `cores`, else the first dead link among `links` (None: all work)."""
        dead = sorted(set(cores) & self.cores)
        if dead:
            return CoreFailure(dead[0])
        for a, b in links:
            if not self.link_alive(a, b):
                return LinkFailure(*sorted((a, b)))
        return None

    def error(self, fault: CoreFailure | LinkFailure, where: str) -> CoreFailed | LinkFailed:
        """The error a command that needs the dead `fault` raises, `where` saying what needed it."""
        if isinstance(fault, CoreFailure):
            return CoreFailed(fault.core, self.held(fault.core), where)
        return LinkFailed(fault.a, fault.b, where)

    def region_links(self, region: Region, axis: str) -> list[tuple[Coord, Coord]]:
        """The dead links inside `region` that run along mesh `axis` ("x": E-W, "y": N-S)."""
        out = []
        for link in self.links:
            a, b = sorted(link)
            if region.contains(a) and region.contains(b) and (a.y == b.y if axis == "x" else a.x == b.x):
                out.append((a, b))
        return sorted(out)


def lost_blocks(layouts: dict[str, Layout], core: Coord) -> tuple[str, ...]:
    """The DSM blocks that `core` holds, named with the tensor and the indices they covered, e.g.
    ``"DSM 'x' block [row 1, col 2] = x[1:2, 2:3, 0:8]"`` (the block's place in the (rows, cols) of the
    tensor's region: the core's [y, x] counted from the region's corner); tensors whose region does not hold the
    core are left out."""
    out = []
    for name, layout in sorted(layouts.items()):
        if not layout.region.contains(core):
            continue
        row, col = layout.region.local(core)
        idx = ", ".join(f"{s.start}:{s.stop}" for s in layout.block_slices(row, col))
        out.append(f"DSM {name!r} block [row {row}, col {col}] = {name}[{idx}]")
    return tuple(out)
