"""Planar geometry of a plan: free rectangles, serpentine packing of equal regions, chain order, Ray nodes.

Contract: pure functions over mesh coordinates (no model knowledge, no Ray).

- :class:`Obstacles`: cores a new region may not use (dead or taken) and dead links; ``free_map(w, h)``
  says, for every top-left corner, whether a w x h rectangle there avoids them all (a region may not
  contain a dead core, nor both ends of a dead link).
- ``blocks``: the mesh cut into packing blocks (a tile, or the fewest tiles that hold one region),
  listed in a serpentine so that consecutive blocks share a border.
- ``pack``: regions of one shape laid greedily in shelves inside a block (sliding past blocked cores),
  the shelves walked as a serpentine (8 patterns: shelves as rows or columns, taken from either end of
  the block, the first walked either way), so that consecutive regions touch.
- ``chain``: picks one pattern per block (dynamic programming over blocks) so that the chain of regions
  is as long as possible and its hand-overs (from a start region and back to it) cross the fewest hops;
  given each block's fixed work and a region's work, it shares the regions out over the blocks so that
  the busiest block carries the least work (``quotas``) instead of filling blocks to capacity.
- ``assign_nodes``: contiguous runs of tiles per Ray node, proportional to CPUs.
- ``tile_box`` / ``shares`` / ``tile_bytes``: which tiles a region touches, its cores in each, and the
  weight bytes that lands on every tile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from waferrt.core.arith import cdiv, first_true
from waferrt.core.mesh import Coord, Extent, MeshSpec, Region, TileId

Link = tuple[Coord, Coord]
SLACK = 3  # regions the chain's dynamic program may give back where hand-overs are shortest


@dataclass(frozen=True)
class Shelves:
    """How ``pack`` lays regions in a block: in shelves that are rows (`by_rows`) or columns, taken from the
    block's start (its top or left, `from_start`) or its end, the first shelf walked forward (along x or y
    growing) or back; each next shelf is walked the other way (a serpentine)."""

    by_rows: bool
    from_start: bool
    forward: bool


PATTERNS = tuple(Shelves(by_rows, from_start, forward) for by_rows in (True, False)
                 for from_start in (True, False) for forward in (True, False))


def check_links(mesh: MeshSpec, links: Iterable[Link]) -> None:
    """Raise ValueError unless every dead link joins two neighbouring cores of the mesh."""
    for a, b in links:
        if not (mesh.region.contains(a) and mesh.region.contains(b)) or a.hops_to(b) != 1:
            raise ValueError(
                f"dead link {a}-{b} is not a link of the {mesh.width}x{mesh.height} mesh: a link joins two "
                "cores inside the mesh that are one hop apart (N/E/S/W neighbours)"
            )


def link_inside(region: Region, a: Coord, b: Coord) -> bool:
    """Whether the link joining cores `a` and `b` lies inside `region` (both its ends do)."""
    return region.contains(a) and region.contains(b)


def cores_in(cores: frozenset[Coord], regions: list[Region]) -> frozenset[Coord]:
    """The cores that lie in some region (vectorised: spare sets hold thousands of cores)."""
    if not cores:
        return frozenset()
    listed = list(cores)
    xs, ys = np.array([c.x for c in listed]), np.array([c.y for c in listed])
    inside = np.zeros(len(listed), bool)
    for r in regions:
        inside |= (xs >= r.x0) & (xs < r.x1) & (ys >= r.y0) & (ys < r.y1)
    return frozenset(c for c, hit in zip(listed, inside.tolist(), strict=True) if hit)


def _window_sums(a: np.ndarray, h: int, w: int, corners: Extent) -> np.ndarray:
    """[y, x]: the sum of the h x w window of `a` whose top-left corner is (x, y), for every (x, y) of the
    `corners` grid."""
    n, m = corners.height, corners.width
    p = np.zeros((a.shape[0] + 1, a.shape[1] + 1), np.int64)
    p[1:, 1:] = a.cumsum(0).cumsum(1)
    return p[h:h + n, w:w + m] - p[:n, w:w + m] - p[h:h + n, :m] + p[:n, :m]


class Obstacles:
    """Blocked cores and dead links of a mesh, with whole-mesh rectangle queries."""

    def __init__(self, width: int, height: int, cores: Iterable[Coord] = (), links: Iterable[Link] = ()):
        self.width, self.height = width, height
        self.blocked = np.zeros((height, width), bool)
        for c in cores:
            self.blocked[c.y, c.x] = True
        self.links = tuple(links)
        self._h = np.zeros((height, width - 1), np.int64)  # link (x,y)-(x+1,y) at [y, x]
        self._v = np.zeros((height - 1, width), np.int64)  # link (x,y)-(x,y+1) at [y, x]
        for a, b in self.links:
            if a.y == b.y:
                self._h[a.y, min(a.x, b.x)] = 1
            else:
                self._v[min(a.y, b.y), a.x] = 1

    def with_regions(self, regions: Iterable[Region]) -> Obstacles:
        """A copy in which the cores of `regions` are blocked too."""
        out = Obstacles.__new__(Obstacles)
        out.width, out.height, out.links = self.width, self.height, self.links
        out._h, out._v = self._h, self._v
        out.blocked = self.blocked.copy()
        for r in regions:
            out.blocked[r.y0:r.y1, r.x0:r.x1] = True
        return out

    def free_map(self, w: int, h: int) -> np.ndarray:
        """bool[y, x]: the w x h rectangle with top-left core (x, y) holds no blocked core nor dead link."""
        corners = Extent(self.width - w + 1, self.height - h + 1)
        if corners.width < 1 or corners.height < 1:
            return np.zeros((0, 0), bool)
        bad = _window_sums(self.blocked.astype(np.int64), h, w, corners)
        bad = bad + _window_sums(self._h, h, w - 1, corners) + _window_sums(self._v, h - 1, w, corners)
        return bad == 0


def tiles_spanned(mesh: MeshSpec, r: Region) -> int:
    cols = (r.x1 - 1) // mesh.tile_w - r.x0 // mesh.tile_w + 1
    return cols * ((r.y1 - 1) // mesh.tile_h - r.y0 // mesh.tile_h + 1)


def serpentine(nx: int, ny: int, by_rows: bool) -> list[tuple[int, int]]:
    """Cells of an nx x ny grid in boustrophedon order (row by row, or column by column)."""
    if by_rows:
        return [(i if j % 2 == 0 else nx - 1 - i, j) for j in range(ny) for i in range(nx)]
    return [(i, j if i % 2 == 0 else ny - 1 - j) for i in range(nx) for j in range(ny)]


def blocks(mesh: MeshSpec, w: int, h: int, by_rows: bool) -> list[Region]:
    """Packing blocks for w x h regions in serpentine order: single tiles when a region fits in a tile,
    else the fewest tiles (bx x by) that hold one."""
    bx, by = cdiv(w, mesh.tile_w), cdiv(h, mesh.tile_h)
    nx, ny = cdiv(mesh.tiles_x, bx), cdiv(mesh.tiles_y, by)
    out = []
    for i, j in serpentine(nx, ny, by_rows):
        x0, y0 = i * bx * mesh.tile_w, j * by * mesh.tile_h
        w, h = min(bx * mesh.tile_w, mesh.width - x0), min(by * mesh.tile_h, mesh.height - y0)
        out.append(Region(x0, y0, w, h))
    return out


def _take(cands: np.ndarray, length: int, forward: bool) -> list[int]:
    """Greedy non-overlapping starts from sorted candidate starts; a backward shelf walks the same
    starts in reverse, so that consecutive shelves line up and their ends touch."""
    out: list[int] = []
    nxt = -1
    for c in cands.tolist():
        if c >= nxt:
            out.append(c)
            nxt = c + length
    return out if forward else out[::-1]


def pack(free: np.ndarray, block: Region, w: int, h: int, pattern: Shelves) -> list[Region]:
    """w x h regions at free positions inside `block`, in shelves walked as a serpentine (see PATTERNS)."""
    from_start, forward = pattern.from_start, pattern.forward
    if pattern.by_rows:
        (l0, l1, step), (p0, p1, length), fmap = (block.y0, block.y1, h), (block.x0, block.x1, w), free
    else:
        (l0, l1, step), (p0, p1, length), fmap = (block.x0, block.x1, w), (block.y0, block.y1, h), free.T
    n = (l1 - l0) // step
    if n == 0 or p1 - p0 < length:
        return []
    starts = [l0 + k * step for k in range(n)] if from_start else [l1 - (k + 1) * step for k in range(n)]
    out = []
    for s in starts:
        placed = _take(np.flatnonzero(fmap[s, p0:p1 - length + 1]) + p0, length, forward)
        if placed:
            out += [Region(p, s, w, h) if pattern.by_rows else Region(s, p, w, h) for p in placed]
            forward = not forward
    return out


def path_hops(regions: Sequence[Region]) -> int:
    return sum(a.hops_to(b) for a, b in pairwise(regions))


def quotas(caps: Sequence[int], fixed: Sequence[int], unit: int, need: int) -> list[int]:
    """The most regions each block may take so that `need` regions balance the work: block i holds at
    most caps[i] regions of `unit` work each on top of its fixed work fixed[i] (e.g. the embedding's
    bytes). Returns block i's count at the smallest bound T on any block's work for which the counts
    hold `need` (exact: T is searched over every value a block's work can take); they add up to `need`
    plus less than one region per block (the slack ``chain`` takes back where hops are fewest). When the
    blocks hold `need` regions or fewer, that is every block's capacity."""
    if sum(caps) <= need or unit <= 0:
        return list(caps) if sum(caps) <= need else _fill(caps, need)
    floor = max(fixed, default=0)

    def counts(t: int) -> list[int]:
        return [min(c, (t - f) // unit) if t >= f else 0 for c, f in zip(caps, fixed, strict=True)]

    targets = sorted({v for c, f in zip(caps, fixed, strict=True) for k in range(c + 1)
                      if (v := f + k * unit) >= floor} | {floor})
    # counts(targets[-1]) == caps, which hold `need`
    return counts(targets[first_true(0, len(targets) - 1, lambda i: sum(counts(targets[i])) >= need)])


def _fill(caps: Sequence[int], need: int) -> list[int]:
    """Blocks filled to capacity in order until `need` regions are placed."""
    out, left = [], need
    for c in caps:
        out.append(min(c, left))
        left -= out[-1]
    return out


@dataclass(frozen=True)
class Balance:
    """The work ``chain`` balances over the blocks: the work each block already carries (`fixed`, e.g. the
    embedding's bytes), the work of one region (`unit`), and the most regions the packer lays in each
    block (`caps`, counted by the caller: the blocks the chain does not reach are then never packed)."""

    fixed: tuple[int, ...]
    unit: int
    caps: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.fixed) != len(self.caps) or self.unit < 0 or min(self.caps, default=0) < 0:
            raise ValueError(f"a Balance has one fixed work and one cap per block and a region's work >= 0; got "
                             f"{len(self.fixed)} fixed, {len(self.caps)} caps, unit {self.unit}")


def chain(blocks_: Sequence[Region], packer: Callable[[Region], list[list[Region]]], start: Region | None,
          need: int, balance: Balance | None = None) -> tuple[list[Region], list[Region]]:
    """Choose one packing per block, and how many regions each block takes: packer(block) lists the
    candidate sequences of a block, of which each block keeps only its longest.

    Without a `balance`, blocks are filled in order until `need` regions are chained. With one (`fixed`: the
    work each block already carries, `unit`: the work of one region), every block is packed and may
    take up to its balanced share (:func:`quotas`): the most loaded block then carries the least work
    possible; the serpentine order of blocks stays, a block simply takes fewer regions and the chain
    moves on earlier. The shares exceed `need` by some slack; all but ``SLACK`` regions of it are given
    back by the last blocks of the chain, the rest where hand-overs are shortest.
    Its `caps` (the most regions ``packer`` lays in each block, counted by the caller) spare packing the
    blocks that the chain and its spare slots do not reach.
    A dynamic program over blocks (state: slack given back so far, the last region, whether the chain
    has ended) picks the sequences and counts whose hand-overs (from `start`, between consecutive
    regions, and from the last back to `start`: the head) cross the fewest hops, then whose block work
    has the least sum of squares. A block that gives back its whole share ends the chain (so the chain
    does not jump over a block it could use); blocks before the first region, and blocks whose share
    is 0 (full, or their fixed work already at the bound), are passed over.
    Returns (chain[:need], up to `need` free slots: the rest of every used block's sequence, then the
    other blocks' longest ones, in chain order)."""
    packed: dict[int, list[list[Region]]] = {}

    def longest(b: int) -> list[list[Region]]:
        if b not in packed:
            seqs = packer(blocks_[b])
            top = max((len(s) for s in seqs), default=0)
            packed[b] = list({tuple(s): s for s in seqs if len(s) == top}.values()) if top else []
        return packed[b]

    fixed, unit, caps = (None, 0, None) if balance is None else (balance.fixed, balance.unit, balance.caps)
    caps = _caps(len(blocks_), longest, need, fixed is None) if caps is None else list(caps)
    work = [0] * len(caps) if fixed is None else list(fixed)[:len(caps)]
    most = _fill(caps, need) if fixed is None else quotas(caps, work, unit, need)
    extra = sum(most) - need - SLACK
    for b in reversed(range(len(most))):  # give back all but SLACK from the end of the chain
        if extra <= 0:
            break
        back = min(most[b], extra)
        most[b], extra = most[b] - back, extra - back
    opts = {b: longest(b) for b, m in enumerate(most) if m}
    used = _best_counts(opts, most, work, unit, start, max(0, sum(most) - need))
    full, spare = [], []
    for b in range(len(caps)):
        if b not in used and len(spare) >= need:
            continue
        seqs = longest(b) if caps[b] else []
        j, n = used.get(b, (0, 0))
        seq = seqs[j] if seqs else []
        full += seq[:n]
        spare += seq[n:]
    return full[:need], spare[:need]


def _caps(n_blocks: int, longest, need: int, stop_early: bool) -> list[int]:
    """The most regions each block can take (its longest packing); without balancing, only as many blocks
    as the chain and as many spare slots need."""
    caps, total = [], 0
    for b in range(n_blocks):
        if stop_early and total >= 2 * need:
            break
        caps.append(len(longest(b)[0]) if longest(b) else 0)
        total += caps[-1]
    return caps


def _best_counts(opts: dict, most: list[int], work: list[int], unit: int, start: Region | None,
                 slack: int) -> dict[int, tuple[int, int]]:
    """The dynamic program of :func:`chain`: block -> (which sequence, how many regions of it)."""
    hops = {b: [[0] + [path_hops(s[:n]) for n in range(1, len(s) + 1)] for s in seqs] for b, seqs in opts.items()}
    # state (slack given back, last region or None before the first, ended) -> (cost, path as nested pairs)
    states: dict[tuple, tuple[tuple[int, int], tuple]] = {(0, None, False): ((0, 0), ())}
    for b, m in enumerate(most):
        nxt: dict[tuple, tuple[tuple[int, int], tuple]] = {}

        def put(key, got, nxt=nxt):
            if key not in nxt or got < nxt[key]:
                nxt[key] = got

        for (d, end, ended), ((h, sq), path) in states.items():
            for n in range(max(0, m - (slack - d)), m + 1):
                sq_n = sq + (work[b] + n * unit) ** 2
                if n == 0:  # a block that could take regions and gives them all back ends the chain
                    put((d + m, end, ended or (end is not None and m > 0)), ((h, sq_n), path))
                elif not ended:
                    for j, seq in enumerate(opts[b]):
                        link = _link(start, seq[0]) if end is None else end.hops_to(seq[0])
                        put((d + m - n, seq[n - 1], False), ((h + link + hops[b][j][n], sq_n), ((b, j, n), path)))
        states = nxt
    done = [((h + (_link(start, end) if end is not None else 0), sq), path)
            for (d, end, _), ((h, sq), path) in states.items() if d == slack]
    path = min(done)[1] if done else ()
    used = {}
    while path:
        b, j, n = path[0]
        used[b] = (j, n)
        path = path[1]
    return used


def _link(a: Region | None, b: Region) -> int:
    return 0 if a is None else a.hops_to(b)


def assign_nodes(mesh: MeshSpec, names: Sequence[str], cpus: Sequence[int]) -> tuple[tuple[TileId, str], ...]:
    """Tiles to Ray nodes: the tile serpentine (by rows or by columns, whichever cuts fewer tile borders)
    cut into contiguous runs, one per node, of sizes proportional to the nodes' CPUs."""
    n = len(mesh.tiles())
    quotas = [n * c / sum(cpus) for c in cpus]
    sizes = [int(q) for q in quotas]
    for i in sorted(range(len(cpus)), key=lambda i: (sizes[i] - quotas[i], i))[:n - sum(sizes)]:
        sizes[i] += 1
    owners = [name for name, k in zip(names, sizes, strict=True) for _ in range(k)]
    best = None
    for by_rows in (True, False):
        order = serpentine(mesh.tiles_x, mesh.tiles_y, by_rows)
        cand = tuple(sorted((TileId(i, j), owner) for (i, j), owner in zip(order, owners, strict=True)))
        key = node_borders(mesh, cand)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


def node_borders(mesh: MeshSpec, tile_nodes: Iterable[tuple[TileId, str]]) -> int:
    """How many borders between neighbouring tiles separate two different Ray nodes."""
    node = dict(tile_nodes)
    return sum(1 for t in node for nb in (TileId(t.tx + 1, t.ty), TileId(t.tx, t.ty + 1))
               if nb in node and node[nb] != node[t])


def tile_box(mesh: MeshSpec, r: Region) -> tuple[int, int, int, int]:
    """(first tile column, first tile row, last tile column, last tile row) that region r touches."""
    return (r.x0 // mesh.tile_w, r.y0 // mesh.tile_h, (r.x1 - 1) // mesh.tile_w, (r.y1 - 1) // mesh.tile_h)


def shares(mesh: MeshSpec, r: Region) -> list[tuple[int, int, int]]:
    """(tile column, tile row, cores of r in that tile) for every tile that r touches."""
    tx0, ty0, tx1, ty1 = tile_box(mesh, r)
    out = []
    for ty in range(ty0, ty1 + 1):
        for tx in range(tx0, tx1 + 1):
            part = Region(tx * mesh.tile_w, ty * mesh.tile_h, mesh.tile_w, mesh.tile_h).intersect(r)
            if part is not None:
                out.append((tx, ty, part.size))
    return out


def tile_bytes(mesh: MeshSpec, tables: Sequence[Region], layers: Sequence[Region], embed_bytes: int,
               layer_bytes: int) -> list[int]:
    """Weight bytes on every tile (row-major, as ``mesh.tiles()``): each region's bytes split over the
    tiles it touches in proportion to its cores there; `tables` are the embedding's region and an untied
    head's (embed_bytes each)."""
    out = [0] * (mesh.tiles_x * mesh.tiles_y)
    for r, nbytes in (*((t, embed_bytes) for t in tables), *((r, layer_bytes) for r in layers)):
        for tx, ty, cores in shares(mesh, r):
            out[ty * mesh.tiles_x + tx] += nbytes * cores // r.size
    return out
