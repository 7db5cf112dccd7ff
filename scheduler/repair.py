"""Re-planning around newly dead cores and links, moving as little as possible.

Contract: ``replan(placement, dead_cores, dead_links) -> Replan`` is pure. Regions that the failure does
not touch stay where they are. A broken layer moves to a free rectangle of its (unchanged) shape, the
free spare slots first, preferring one inside a tile and next to its neighbours in the chain. When every
region lay inside one tile (as the decode on the tile actors needs), every region still does. A broken
embedding moves to a free rectangle of any shape that fits, or, when there is none, to the one that
displaces the fewest layers (which then move to free space too); an untied head's region moves as the
embedding does, around it. Only when that fails is the model
planned afresh on the damaged mesh (``Replan.mode == "fresh"``), and only when that fails too does
``replan`` raise :class:`PlanError`, saying why. ``Replan.moves`` lists exactly what moves: every weight
tensor of a moved layer and its KV shards (tensor "kv"), or the "embed" table and "final_norm", or an untied
head's table and its final norm (``HEAD_TENSORS``).

A weight-streaming placement (``Placement.streaming``: one region runs every stage) hit by the failure is
planned afresh on the damaged mesh (``placement.plan_streaming``: a region inside one tile around every dead
core and link; mode "fresh", every stage moves); its moves are every layer's K/V only (its weights stay off
the wafer and stream into the new region), and no room raises PlanError in streaming terms.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from waferrt.core.mesh import Coord, Extent, MeshSpec, Region

from . import budget
from .geometry import Obstacles, check_links, cores_in, link_inside, tiles_spanned
from .placement import plan, plan_streaming, violations
from .types import Placement, PlanError, PlanOptions

HEAD_TENSORS = ("head", "head_norm")  # what an untied head's region holds: its table and the final norm


@dataclass(frozen=True)
class Move:
    tensor: str  # a waferrt.decode.layout.layer_layouts name, "kv", "embed" or "final_norm", or HEAD_TENSORS
    layer: int | None  # None for the embedding/head tensors
    src: Region
    dst: Region
    nbytes: int  # the whole tensor (for "kv": K and V of every request, at the old capacity)


@dataclass(frozen=True)
class Replan:
    placement: Placement
    moves: tuple[Move, ...]
    broken: tuple[str, ...]  # regions the failure hit: "embed", "layer 3", ...
    mode: str  # "unchanged" (nothing hit), "local" (only broken/displaced regions moved) or "fresh"

    @property
    def moved(self) -> tuple[str, ...]:
        """The regions that move, as "embed" / "layer i" / "head"."""
        if self.placement.streaming:  # one region runs every stage: they move together
            return tuple(name for name, _ in self.placement.regions()) if self.moves else ()
        names = [f"layer {m.layer}" if m.layer is not None else "head" if m.tensor in HEAD_TENSORS else "embed"
                 for m in self.moves]
        return tuple(dict.fromkeys(names))


def _hit(r: Region, dead: frozenset[Coord], links) -> bool:
    return any(r.contains(c) for c in dead) or any(link_inside(r, *link) for link in links)


def _embed_shapes(p: Placement, mesh: MeshSpec, old: Region) -> list[tuple[int, int]]:
    """Embedding (or head) shapes worth trying: the `old` one and, for a spread of widths, the fewest rows
    that fit."""
    config, top = p.config, min(p.config.dim, mesh.width)
    widths = {old.w, *np.unique(np.geomspace(1, top, 48).round().astype(int)).tolist()}
    widths |= set(range(p.layers[0].w, top + 1, p.layers[0].w))
    out = []
    for we in sorted(widths):
        he = budget.embed_rows_needed(config, p.spec.sram_bytes, we, p.dtype)
        if he is not None and he <= mesh.height:
            out.append((we, he))
    return out


def _displaced(w: int, h: int, corners: Extent, layers: dict[int, Region]) -> np.ndarray:
    """[y, x]: how many of `layers` a w x h rectangle at (x, y) overlaps, for every top-left corner (x, y) of
    the `corners` grid."""
    diff = np.zeros((corners.height + 1, corners.width + 1), np.int64)
    for r in layers.values():
        x0, y0 = max(0, r.x0 - w + 1), max(0, r.y0 - h + 1)
        x1, y1 = min(corners.width, r.x1), min(corners.height, r.y1)
        if x0 < x1 and y0 < y1:
            diff[y0, x0] += 1
            diff[y0, x1] -= 1
            diff[y1, x0] -= 1
            diff[y1, x1] += 1
    return diff.cumsum(0).cumsum(1)[:corners.height, :corners.width]


@dataclass(frozen=True)
class _Wanted:
    """A region to place anew: its shape, the regions it hands over to (`near`), where it was (`old`)."""

    w: int
    h: int
    near: tuple[Region, ...]
    old: Region

    def __post_init__(self) -> None:
        if self.w < 1 or self.h < 1:
            raise ValueError(f"a region to place is at least 1x1 cores, got {self.w}x{self.h}")


def _pick(mesh: MeshSpec, free: np.ndarray, want: _Wanted, first: np.ndarray | None = None,
          whole: bool = False) -> tuple[tuple[int, int, int, int], Region] | None:
    """Best position among free[y, x] for `want`: fewest `first` (e.g. layers displaced), inside one tile
    (only those when `whole`), fewest hops to its `near`, then nearest its `old`. Returns (its key, region)
    or None."""
    w, h, near, old = want.w, want.h, want.near, want.old
    ys, xs = np.nonzero(free)
    span = (xs + w - 1) // mesh.tile_w - xs // mesh.tile_w + (ys + h - 1) // mesh.tile_h - ys // mesh.tile_h
    if whole:
        ys, xs, span = ys[span == 0], xs[span == 0], span[span == 0]
    if not len(xs):
        return None
    hops = np.zeros(len(xs), np.int64)
    for r in near:
        hops += np.maximum(0, np.maximum(r.x0 - (xs + w - 1), xs - (r.x1 - 1)))
        hops += np.maximum(0, np.maximum(r.y0 - (ys + h - 1), ys - (r.y1 - 1)))
    dist = np.abs(xs - old.x0) + np.abs(ys - old.y0)
    lead = first[ys, xs] if first is not None else np.zeros(len(xs), np.int64)
    i = np.lexsort((dist, hops, span > 0, lead))[0]
    key = (int(lead[i]), int(span[i] > 0), int(hops[i]), int(dist[i]))
    return key, Region(int(xs[i]), int(ys[i]), w, h)


def _neighbours(i: int, layers: dict[int, Region], tables: tuple[Region, ...], n: int) -> list[Region]:
    out = [layers.get(i - 1) if i > 0 else tables[0], layers.get(i + 1) if i < n - 1 else tables[-1]]
    return [r for r in out if r is not None]


def _table_positions(p: Placement, mesh: MeshSpec, base: Obstacles, layers: dict[int, Region], old: Region,
                     whole: bool) -> list[Region]:
    """Free positions for the table region at `old` (the embedding's, or an untied head's), best first: the best
    of each shape, ranked by layers displaced, then inside one tile, hops to the chain's ends it hands over to,
    and cores."""
    found = []
    ends = (p.layers[0], p.layers[-1]) if p.head is None else (p.layers[0],) if old == p.embed else (p.layers[-1],)
    for we, he in _embed_shapes(p, mesh, old):
        free = base.free_map(we, he)
        got = _pick(mesh, free, _Wanted(we, he, ends, old),
                    _displaced(we, he, Extent(free.shape[1], free.shape[0]), layers), whole) if free.size else None
        if got:
            found.append((got[0][:3], we * he, got[0][3], got[1]))
    return [r for *_, r in sorted(found, key=lambda t: t[:3])]


def _place_layers(p: Placement, mesh: MeshSpec, base: Obstacles, tables: tuple[Region, ...],
                  layers: dict[int, Region], whole: bool) -> dict[int, Region] | None:
    """Free w x h rectangles for the layers not in `layers` (spare slots first), or None when one has none."""
    n, (w, h), layers = len(p.layers), (p.layers[0].w, p.layers[0].h), dict(layers)
    todo = [i for i in range(n) if i not in layers]
    spare = np.zeros((mesh.height, mesh.width), np.int64)
    for c in p.spare - mesh.dead:
        spare[c.y, c.x] = 1
    for i in sorted(todo):
        free = base.with_regions([*tables, *layers.values()]).free_map(w, h)
        if not free.size:
            return None
        outside = 1 - np.lib.stride_tricks.sliding_window_view(spare, (h, w)).min(axis=(2, 3))
        got = _pick(mesh, free, _Wanted(w, h, tuple(_neighbours(i, layers, tables, n)), p.layers[i]), outside, whole)
        if got is None:
            return None
        layers[i] = got[1]
    return layers


def _repair(p: Placement, mesh: MeshSpec, links: frozenset, broken: list[str],
            whole: bool) -> tuple[tuple[Region, ...], dict[int, Region]] | None:
    """New table regions (the embedding's, an untied head's) and layer regions, moving only broken (and
    displaced) regions; None: no room. A broken table tries its new positions, best first (the head's around
    the embedding's), until the layers it displaces find room. `whole`: every region lies inside one tile (the
    decode's rule)."""
    healthy = {i: r for i, r in enumerate(p.layers) if f"layer {i}" not in broken}
    base = Obstacles(mesh.width, mesh.height, mesh.dead, links)
    kept_head = [] if p.head is None or "head" in broken else [p.head]
    embeds = (_table_positions(p, mesh, base.with_regions(kept_head), healthy, p.embed, whole)
              if "embed" in broken else [p.embed])
    for embed in embeds:
        heads = [None] if p.head is None else [p.head] if kept_head else _table_positions(
            p, mesh, base.with_regions([embed]), healthy, p.head, whole)[:4]
        for head in heads:
            tables = (embed,) if head is None else (embed, head)
            kept = {i: r for i, r in healthy.items() if all(r.intersect(t) is None for t in tables)}
            layers = _place_layers(p, mesh, base, tables, kept, whole)  # the broken layers and those displaced
            if layers is not None:
                return tables, layers
    return None


def _moves(old: Placement, new: Placement) -> tuple[Move, ...]:
    sizes = budget.tensor_bytes(old.config, old.dtype)
    kv = budget.kv_bytes(old.config, old.kv_tokens, old.kv.requests, old.dtype)
    layer = tuple(t for t in sizes if t not in ("embed", "final_norm"))  # what a layer region books (an MoE's experts)
    held = () if old.streaming else layer  # streamed weights stay off the wafer: only K/V moves
    out = []
    if new.embed != old.embed and not old.streaming:
        out += [Move(t, None, old.embed, new.embed, sizes[t]) for t in ("embed", "final_norm")]
    if new.head != old.head and old.head is not None and new.head is not None and not old.streaming:
        out += [Move(t, None, old.head, new.head, sizes[s]) for t, s in zip(HEAD_TENSORS, ("embed", "final_norm"),
                                                                              strict=True)]
    for i, (a, b) in enumerate(zip(old.layers, new.layers, strict=True)):
        if a != b:
            out += [Move(t, i, a, b, sizes[t]) for t in held] + [Move("kv", i, a, b, kv)]
    return tuple(out)


def _replan_streaming(p: Placement, mesh: MeshSpec, links: frozenset, broken: list[str]) -> Replan:
    """The streaming region planned afresh around the dead (module docstring)."""
    try:
        new = plan_streaming(p.config, p.spec, mesh, kv=p.kv,
                             options=PlanOptions(dtype=p.dtype, nodes=p.nodes, dead_links=links))
    except PlanError as e:
        raise PlanError(f"cannot re-plan the streaming region {p.embed} that the failure breaks: {e}") from None
    return Replan(new, _moves(p, new), tuple(broken), "fresh")


def replan(placement: Placement, dead_cores: frozenset[Coord] = frozenset(),
           dead_links: frozenset[tuple[Coord, Coord]] = frozenset()) -> Replan:
    """A placement that avoids the newly dead cores and links, and the moves that get there."""
    p = placement
    try:
        mesh = p.mesh.with_dead(dead_cores)
        links = p.dead_links | frozenset(dead_links)
        check_links(mesh, links)
    except ValueError as e:
        raise PlanError(f"cannot re-plan: {e}") from None
    broken = [name for name, r in p.regions() if _hit(r, mesh.dead, links)]
    spare = frozenset(p.spare - mesh.dead)
    if not broken:
        new = dataclasses.replace(p, mesh=mesh, dead_links=links, spare=spare)
        return Replan(new, (), (), "unchanged")
    if p.streaming:
        return _replan_streaming(p, mesh, links, broken)
    whole = all(tiles_spanned(p.mesh, r) == 1 for _, r in p.regions())  # kept so: the decode needs it
    fixed = _repair(p, mesh, links, broken, whole) if p.group == 1 else None  # a group's region moves afresh
    if fixed is not None:
        tables, layers = fixed
        regions = (*tables, *layers.values())
        spare = spare - cores_in(spare, list(regions))
        new = dataclasses.replace(p, mesh=mesh, dead_links=links, embed=tables[0], spare=spare,
                                  layers=tuple(layers[i] for i in range(len(p.layers))),
                                  head=tables[1] if len(tables) > 1 else None)
        bad = violations(new)
        if bad:
            raise PlanError("the local repair broke a rule (a bug in waferrt.scheduler): " + "; ".join(bad))
        return Replan(new, _moves(p, new), tuple(broken), "local")
    try:
        new = plan(p.config, p.spec, mesh, kv=p.kv,
                   options=PlanOptions(dtype=p.dtype, strategy=p.strategy, nodes=p.nodes, dead_links=links))
    except PlanError as e:
        raise PlanError(f"cannot re-plan: the failure breaks {', '.join(broken)}; there is no free room to "
                        f"move them and no fresh plan fits the damaged mesh either: {e}") from None
    across = [f"{name} {r}" for name, r in new.regions() if tiles_spanned(mesh, r) > 1]
    if whole and across:
        raise PlanError(f"cannot re-plan: the failure breaks {', '.join(broken)}; there is no free room inside "
                        f"one tile to move them, and a fresh plan puts {', '.join(across[:3])} across tiles (the "
                        "decode runs every region inside one tile)")
    return Replan(new, _moves(p, new), tuple(broken), "fresh")
