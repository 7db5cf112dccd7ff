"""The planner's search: which layer shape, where the embedding goes, which packing; and mesh sizing.

Contract: pure functions returning regions (no Placement). ``best_layout`` tries layer shapes best
first (inside one tile, then fewest cores, then wide) and, for each, the embedding as a band across the
first packing block (top or left, its side rounded up to whole layer slots) or, when it does not fit
there, across the mesh; the layers are packed around it in both block serpentines, and the first shape
that holds every layer wins with its best-scoring layout (fewest regions straddling tiles, then the
least weight bytes on the busiest tile (when balancing, the default: the layers are shared out per
block by ``geometry.quotas``), then fewest hand-overs across tiles, then fewest hops, then most spare
slots). ``group`` (layers per region, ``types.Strategy``) makes every region hold that many layers
(their weights and K/V stacked, budgeted by ``budget`` with ``layers=group``): ``cdiv(n_layers, group)``
regions are placed, in chain order. ``smallest_mesh`` finds the
fewest whole tiles on the spec's wafer that hold a model; ``tile_candidates`` proposes tile sizes for
``default_mesh``. A :class:`Slot` is a size in cores (w x h): a layer region's slot, an embedding band.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.mesh import Coord, Extent, MeshSpec, Region, wafer_grid
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from . import budget
from .geometry import PATTERNS, Balance, Obstacles, blocks, chain, pack, path_hops, tile_box, tile_bytes, tiles_spanned
from .types import Workload

UNBOUNDED = 1 << 30


@dataclass(frozen=True)
class Found:
    """The layout of the best attempt: layers is None when the model does not fit (reason says why)."""

    layers: tuple[Region, ...] | None
    embed: Region | None
    spare: tuple[Region, ...]
    reason: str = ""
    head: Region | None = None  # an untied head's region (None: tied, or no fit)


@dataclass(frozen=True)
class WeightBytes:
    """The weight bytes the balancing spreads over the tiles: of a table's region (the embedding, an untied
    head: ``budget.work_bytes``) and of one region of layers."""

    table: int
    region: int


@dataclass(frozen=True)
class Slot:
    """A rectangle's size in cores, `w` columns by `h` rows: a layer region's slot, an embedding band."""

    w: int
    h: int


def _round_up(v: int, step: int, cap: int) -> int:
    r = cdiv(v, step) * step
    return r if r <= cap else v


def embed_bands(config: LlamaConfig, sram: int, dtype: str, area: Region, w: int,
                h: int) -> list[Slot]:
    """The sizes of embedding regions that fill `area`'s width (top band) or height (left band), rounded up
    to whole w x h layer slots."""
    out = []
    we = min(area.w, config.dim)
    rows = budget.embed_rows_needed(config, sram, we, dtype)
    if rows is not None and rows <= area.h:
        out.append(Slot(we, _round_up(rows, h, area.h)))
    he = min(area.h, config.vocab_size)
    cols = budget.embed_cols_needed(config, sram, he, dtype)
    if cols is not None and cols <= min(area.w, config.dim):
        out.append(Slot(_round_up(cols, w, min(area.w, config.dim)), he))
    return list(dict.fromkeys(out))


def _embed_at(mesh: MeshSpec, obstacles: Obstacles, block: Region, band: Slot, slot: Slot) -> Region | None:
    """The free we x he (`band`) position nearest `block`'s north-west corner: inside one tile, inside the
    block and aligned with the w x h layer slots (`slot`) when possible."""
    we, he, w, h = band.w, band.h, slot.w, slot.h
    ys, xs = np.nonzero(obstacles.free_map(we, he))
    if not len(xs):
        return None
    span = ((xs + we - 1) // mesh.tile_w - xs // mesh.tile_w + 1) * (
        (ys + he - 1) // mesh.tile_h - ys // mesh.tile_h + 1)
    outside = (xs < block.x0) | (ys < block.y0) | (xs + we > block.x1) | (ys + he > block.y1)
    misaligned = ((xs - block.x0) % w != 0) | ((ys - block.y0) % h != 0)
    dist = np.abs(xs - block.x0) + np.abs(ys - block.y0)
    i = np.lexsort((dist, misaligned, outside, span))[0]
    return Region(int(xs[i]), int(ys[i]), we, he)


def _embed_options(work: Workload, sram: int, mesh: MeshSpec, obstacles: Obstacles, block: Region,
                   slot: Slot) -> list[Region]:
    for area in (block, mesh.region):
        found = [_embed_at(mesh, obstacles, block, band, slot)
                 for band in embed_bands(work.config, sram, work.dtype, area, slot.w, slot.h)]
        found = [r for r in found if r is not None]
        if found:
            return list(dict.fromkeys(found))
    return []


def _quality(mesh: MeshSpec, tables: tuple[Region, ...], layers: list[Region], weights: WeightBytes | None
             ) -> tuple[int, int, int, int]:
    """(regions straddling tiles (an untied head off the embedding's tile counts as one), most weight bytes on
    one tile (0 when not balancing), hand-overs across tiles, hops): lower is better, in that order. `tables`:
    the embedding's region (and an untied head's, where the chain ends)."""
    chain_ = (tables[0], *layers, tables[-1])
    straddle = sum(tiles_spanned(mesh, r) > 1 for r in (*tables, *layers))
    straddle += tile_box(mesh, tables[-1]) != tile_box(mesh, tables[0])  # the decode samples where tokens enter
    crossings = sum(tile_box(mesh, a) != tile_box(mesh, b) for a, b in pairwise(chain_))
    busiest = max(tile_bytes(mesh, tables, layers, weights.table, weights.region)) if weights else 0
    return straddle, busiest, crossings, path_hops(chain_)


def _block_work(tables: tuple[Region, ...], blks: Sequence[Region], nbytes: int) -> list[int]:
    """The bytes of the tables (embedding, untied head: `nbytes` each) carried by each block, in proportion to
    their cores there."""
    out = []
    for b in blks:
        parts = [(b.intersect(t), t) for t in tables]
        out.append(sum(nbytes * r.size // t.size for r, t in parts if r is not None))
    return out


def _table_options(work: Workload, sram: int, mesh: MeshSpec, obstacles: Obstacles, block: Region,
                   slot: Slot) -> list[tuple[Region, ...]]:
    """Where the tables may go: every embedding position (``_embed_options``), each with, for an untied head,
    the head's first position beside it (the same bands, around the embedding)."""
    out = []
    for embed in _embed_options(work, sram, mesh, obstacles, block, slot):
        if work.config.tie_embeddings:
            out.append((embed,))
            continue
        heads = _embed_options(work, sram, mesh, obstacles.with_regions([embed]), block, slot)
        if heads:
            out.append((embed, heads[0]))
    return out


def _block_caps(free: np.ndarray, blks: Sequence[Region], w: int, h: int) -> list[int]:
    """How many w x h regions ``chain`` gets out of each of `blks` (the most ``pack`` lays in it),
    without packing the blocks in which every position is free (there every pattern lays
    (block w // w) x (block h // h) regions) or none is: only blocks at the edge of an obstacle (the
    embedding, dead cores and links) are packed."""
    corners = np.zeros((free.shape[0] + 1, free.shape[1] + 1), np.int64)
    corners[1:, 1:] = (~free).cumsum(0).cumsum(1)  # blocked top-left corners, as a summed-area table
    out = []
    for b in blks:
        y1, x1 = b.y1 - h + 1, b.x1 - w + 1  # top-left corners of regions inside the block: [y0, y1) x [x0, x1)
        if y1 <= b.y0 or x1 <= b.x0:
            out.append(0)
            continue
        blocked = corners[y1, x1] - corners[b.y0, x1] - corners[y1, b.x0] + corners[b.y0, b.x0]
        if blocked == 0:
            out.append((b.w // w) * (b.h // h))
        elif blocked < (y1 - b.y0) * (x1 - b.x0):  # some free position: pack it
            out.append(max(len(pack(free, b, w, h, pat)) for pat in PATTERNS))
        else:
            out.append(0)
    return out


def _capacity(free: np.ndarray, blks: Sequence[Region], w: int, h: int) -> int:
    """How many w x h regions ``chain`` gets out of all of `blks` (``_block_caps``, summed)."""
    return sum(_block_caps(free, blks, w, h))


def _try_shape(work: Workload, sram: int, mesh: MeshSpec, obstacles: Obstacles, slot: Slot,
               balance: bool = True) -> tuple[Found | None, int]:
    """The best layout of all w x h (`slot`) regions of `work.layers` layers (None when there is none), and the most
    any attempt chained. An attempt (block order and embedding position) whose blocks cannot hold every
    layer is only counted (``_capacity``), not chained: that is what makes a failing shape cheap. With
    `balance`, every block takes a share of the layers that balances the weight bytes per block
    (``geometry.quotas``) and the busiest tile's bytes rank right after straddling regions."""
    w, h, n, best, most, orders = slot.w, slot.h, cdiv(work.config.n_layers, work.layers), None, 0, {}
    embed_bytes, layer_bytes = budget.work_bytes(work.config, work.dtype)
    weights = WeightBytes(embed_bytes, work.layers * layer_bytes) if balance else None
    for by_rows in (True, False):
        orders.setdefault(tuple(blocks(mesh, w, h, by_rows)), None)
    for blks in orders:
        for tables in _table_options(work, sram, mesh, obstacles, blks[0], slot):
            embed = tables[0]
            free = obstacles.with_regions(list(tables)).free_map(w, h)
            caps = _block_caps(free, blks, w, h)
            room = sum(caps)
            if room < n:
                most = max(most, room)
                continue
            balance = None if not weights else Balance(tuple(_block_work(tables, blks, weights.table)), weights.region,
                                                       tuple(caps))
            layers, slots = chain(blks, lambda b, free=free: [pack(free, b, w, h, pat) for pat in PATTERNS],
                                  embed, n, balance)
            most = max(most, len(layers))
            score = (_quality(mesh, tables, layers, weights), -len(slots))
            if len(layers) == n and (best is None or score < best[0]):
                best = (score, Found(tuple(layers), embed, tuple(slots), head=tables[1] if len(tables) > 1 else None))
    return (best[1] if best else None), most


def _shape_bound(mesh: MeshSpec, w: int, h: int) -> int:
    """Most w x h regions the packing blocks could hold (no embedding, no dead cores): the blocks form a
    grid (the last column and row possibly narrower), so this is (sum of w-wide columns over the block
    columns) x (sum of h-high rows over the block rows)."""
    bw, bh = cdiv(w, mesh.tile_w) * mesh.tile_w, cdiv(h, mesh.tile_h) * mesh.tile_h
    cols = (mesh.width // bw) * (bw // w) + (mesh.width % bw) // w
    rows = (mesh.height // bh) * (bh // h) + (mesh.height % bh) // h
    return cols * rows


def _room_for(mesh: MeshSpec, w: int, h: int, n: int, emin: int) -> bool:
    """Whether n w x h layer regions and an embedding of at least emin cores may fit on `mesh`: enough
    live cores, and enough w x h slots in the packing blocks (necessary, not sufficient)."""
    live = mesh.width * mesh.height - len(mesh.dead)
    return w <= mesh.width and h <= mesh.height and n * w * h + emin <= live and _shape_bound(mesh, w, h) >= n


def _hopeless(work: Workload, spec: HardwareSpec) -> str:
    """Why no mesh of any size holds the model at this spec, or '' when some mesh may."""
    config, dtype, group, sram = work.config, work.dtype, work.layers, spec.sram_bytes
    if not budget.layer_shapes(work, sram, UNBOUNDED, UNBOUNDED):
        nbytes, r = budget.smallest_layer_bytes(work)
        what = "layer region" if group == 1 else f"region of {group} layers"
        fewer = "" if group == 1 else ", fewer layers per region (--strategy grouped:N with a smaller N, or layer)"
        return (f"no mesh size helps: even the widest legal {what} ({r.h} rows x {r.w} cols) needs {nbytes} "
                f"bytes on a core, more than the {sram} a core holds; lower the KV reserve (tokens or requests)"
                f"{fewer}, use a smaller dtype, or a spec with more SRAM per core.")
    if budget.embed_rows_needed(config, sram, config.dim, dtype) is None:
        return (f"no mesh size helps: the embedding table does not fit even spread one row per core row "
                f"({config.vocab_size} rows x {config.dim} columns); use a spec with more SRAM per core.")
    return ""


def best_layout(work: Workload, spec: HardwareSpec, mesh: MeshSpec, links: frozenset[tuple[Coord, Coord]] = frozenset(),
                balance: bool = True) -> Found:
    """The best layout of `work` on `mesh` in regions of `work.layers` layers (``Found.layers``: one region
    per group, in chain order), or a Found with layers=None and the reason it does not fit."""
    reason = _hopeless(work, spec)
    if reason:
        return Found(None, None, (), reason)
    config, dtype = work.config, work.dtype
    sram, n = spec.sram_bytes, cdiv(config.n_layers, work.layers)
    shapes = budget.layer_shapes(work, sram, mesh.width, mesh.height)
    shapes = sorted(shapes, key=lambda s: s[0] > mesh.tile_w or s[1] > mesh.tile_h)
    live = mesh.width * mesh.height - len(mesh.dead)
    emin = budget.embed_min_cores(config, sram, dtype) * budget.head_tables(config)
    obstacles = Obstacles(mesh.width, mesh.height, mesh.dead, links)
    most, tried = 0, None
    for w, h in shapes:
        if not _room_for(mesh, w, h, n, emin):
            continue
        found, chained = _try_shape(work, sram, mesh, obstacles, Slot(w, h), balance)
        if found is not None:
            return found
        if tried is None or chained > most:
            most, tried = chained, (w, h)
    if not shapes:
        return Found(None, None, (), "The mesh is smaller than the smallest layer region that fits in SRAM.")
    if tried is None:
        w, h = min(shapes, key=lambda s: s[0] * s[1])
        return Found(None, None, (), f"{n} layer regions of at least {w * h} cores ({w}x{h}) plus an "
                     f"embedding region of at least {emin} cores need {n * w * h + emin} live cores; the "
                     f"mesh has {live}.")
    around = " and around the dead cores/links" if mesh.dead or links else ""
    return Found(None, None, (), f"The best layer region, {tried[0]}x{tried[1]} cores (cols x rows), fits in "
                 f"SRAM but only {most} of {n} such regions fit beside the embedding{around}.")


@lru_cache(maxsize=256)
def smallest_mesh(work: Workload, spec: HardwareSpec, tile: Extent) -> MeshSpec | None:
    """The healthy mesh of the fewest whole tiles (then the squarest) that holds the model, up to the
    spec's full wafer (at most ``wafer_grid`` tiles across and down); None when even that does not.

    Every grid of tiles on the wafer is tried in that order, so none of fewer tiles holds the model. A
    bisection over tile counts would not be sound: "some grid of k tiles fits" is not monotone in k (a
    prime k has only 1 x k and k x 1 grids, which may not be on the wafer). It is not needed either:
    grids whose live cores or layer slots cannot hold the layers and the embedding for any layer shape
    are skipped without packing (``_room_for``, O(1) per shape), and a grid that passes that bound but
    fails is counted per block without being packed (``_capacity``). Cached: every ``plan`` that does
    not fit asks for it, with the same arguments."""
    if _hopeless(work, spec):
        return None
    n, sram = cdiv(work.config.n_layers, work.layers), spec.sram_bytes
    shapes = budget.layer_shapes(work, sram, UNBOUNDED, UNBOUNDED)
    emin = budget.embed_min_cores(work.config, sram, work.dtype) * budget.head_tables(work.config)
    need = n * min(w * h for w, h in shapes) + emin
    nxs, nys = wafer_grid(spec, tile)
    grids = sorted((nx * ny, abs(nx - ny), nx, ny) for nx in range(1, nxs + 1) for ny in range(1, nys + 1)
                   if nx * ny * tile.cores >= need)
    for _, _, nx, ny in grids:
        mesh = MeshSpec.tiled(Extent(nx, ny), tile)
        if not any(_room_for(mesh, w, h, n, emin) for w, h in shapes):
            continue
        if best_layout(work, spec, mesh, balance=False).layers is not None:
            return mesh
    return None


def _embed_slots(config: LlamaConfig, sram: int, dtype: str, tile: Region, w: int, h: int) -> int | None:
    """Layer slots of a tile (a grid of w x h slots) that the embedding band takes; None: it cannot fit."""
    lost = [cdiv(band.w, w) * cdiv(band.h, h) * budget.head_tables(config)
            for band in embed_bands(config, sram, dtype, tile, w, h)]
    return min(lost, default=None)


def tile_candidates(work: Workload, spec: HardwareSpec, tiles: Extent, spare: int) -> Iterator[Extent]:
    """Tile sizes (whole numbers of slots of `group` layers) whose mesh of `tiles` tiles holds every
    region, the embedding inside one tile and `spare` free slots, fewest cores first (then squarest); tiles
    are between 1:2 and 2:1 (width:height) so that the mesh stays compact -- or, for regions of several
    layers (large ones), one slot wide when a slot itself is wider than 2:1 -- and the mesh is on the spec's
    wafer."""
    config, dtype, group = work.config, work.dtype, work.layers
    n, sram, regions, wafer = tiles.cores, spec.sram_bytes, cdiv(config.n_layers, group), spec.full_mesh
    found = set()
    for w, h in budget.layer_shapes(work, sram, UNBOUNDED, UNBOUNDED):
        for a in range(1, 33):
            for b in range(1, 33):
                ratio = 2 * a * w / (b * h)
                if not (1 <= ratio <= 4 or (group > 1 and a == 1 and ratio > 4)):  # wide rather than tall
                    continue
                if tiles.width * a * w > wafer.width or tiles.height * b * h > wafer.height:
                    continue
                lost = _embed_slots(config, sram, dtype, Region(0, 0, a * w, b * h), w, h)
                if lost is not None and n * a * b - lost >= regions + spare:
                    found.add((n * a * w * b * h, abs(a * w - b * h), a * w, b * h))
                    break
    for _, _, tw, th in sorted(found):
        yield Extent(tw, th)
