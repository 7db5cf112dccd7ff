"""The Placement: where every tensor of a Llama model sits on the mesh, and the planner that makes it.

Contract (pure: no Ray, returns immutable data):

- Inputs are frozen values: ``LlamaConfig``, ``HardwareSpec``, ``MeshSpec`` (its ``dead`` cores),
  :class:`KVReserve` (tokens x requests per layer), Ray nodes as :class:`NodeInfo`, dead links.
- ``plan(..., options=PlanOptions(strategy=...)) -> Placement`` (:class:`~waferrt.scheduler.types.PlanOptions`:
  the dtype, strategy, Ray nodes, dead links, balance): ``strategy`` (``types.Strategy``; default: layer, one
  layer per region) says how many consecutive layers share a region: a region of g layers holds their
  weights and K/V stacked on the same cores (one scratch area), budgeted as such; the rules below hold
  for the regions. Every region is a rectangle of live cores, all the same shape
  (rows <= head_dim/2, columns <= dim), the fewest cores that hold its weights + KV reserve + scratch in
  SRAM (sizes from ``waferrt.decode.layout``); the tied embedding + final norm + head get one more
  region, and an untied output head (its table + the final norm) one more again (``Placement.head``), placed
  as the embedding is. Regions are packed inside tiles when they fit in one, consecutive layers touch (a serpentine
  of shelves inside a tile, continued into the neighbouring tile), and tiles go to Ray nodes in
  contiguous runs. The layers are spread over the tiles so that the decode work of the busiest tile
  (the weight bytes of its regions, ``budget.work_bytes``; one process per tile) is as small as it can
  be: each tile takes its balanced share of the chain and the chain moves on to the next tile (spare
  slots spread over the tiles); straddling regions still rank first. A model that does not fit raises
  :class:`PlanError` with the bytes needed, the bytes available and the smallest mesh (at this spec and
  tile size) that holds it; a mesh larger than the spec's whole wafer raises ``MeshTooLarge`` and an
  argument of the wrong type ``TypeError``, both before any search.
- :class:`~waferrt.scheduler.types.Placement` is frozen and hashable; ``violations(p)`` lists the rules it
  breaks (empty for anything ``plan`` returns); ``report.plan_report(p)`` measures it and
  ``serial.placement_to_json`` / ``placement_from_json`` round-trip it.
- ``default_mesh(config, spec, kv, options=PlanOptions(strategy=...))``: the smallest mesh of 2x2 tiles
  holding the model with
  every region inside one tile and spare slots for repair (1x2, 2x1 or 1x1 tiles when regions of many
  layers make 2x2 tiles larger than the wafer); ``mesh_tries`` yields each mesh it tries (a MeshTry), for a
  caller that bounds the search in time.

- ``plan_streaming(config, spec, mesh, kv=..., options=PlanOptions(dead_links=...))``: weight streaming
  (``waferrt.decode.streaming``):
  one region runs every stage and keeps only every layer's K/V, a double buffer of weight blocks and the
  scratch (``decode.layout.stream_booking``). It is the rectangle inside one tile, at most dim columns and
  head_dim/2 rows, with no dead core (``mesh.dead``) nor dead link inside, whose cores hold that: the most
  cores first (the shortest compute), then the widest, the first tile, the top-left position -- on a healthy
  mesh the widest, tallest rectangle at the first tile's corner. None fits: :class:`PlanError` naming what
  died, the largest region left and the region it would take. ``streaming_mesh`` is the smallest one-tile
  mesh whose region holds that.

Re-planning around failures is :func:`waferrt.scheduler.repair.replan`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from waferrt.core.arith import cdiv, first_true
from waferrt.core.dtypes import STORAGE_DTYPES
from waferrt.core.mesh import Extent, MeshSpec, Region, check_on_wafer
from waferrt.core.spec import HardwareSpec
from waferrt.decode import layout as dl
from waferrt.model.config import LlamaConfig

from . import budget, search
from .geometry import Obstacles, assign_nodes, check_links, cores_in, link_inside
from .report import plan_report
from .types import KVReserve, Placement, PlanError, PlanOptions, Strategy, Workload

DEFAULT_TILES = Extent(2, 2)  # the default mesh's tiles, across and down


def violations(p: Placement) -> tuple[str, ...]:
    """Every rule placement `p` breaks, in words (empty when it is sound)."""
    config, mesh, out = p.config, p.mesh, []
    if len(p.layers) != config.n_layers or not p.layers:
        return (f"{len(p.layers)} layer regions for a model of {config.n_layers} layers",)
    if p.streaming:
        return tuple(_stream_faults(p))
    if not 1 <= p.group <= config.n_layers:
        return (f"group {p.group} is not 1..{config.n_layers} layers per region",)
    g = p.group
    out += [f"layer {i} is on {r}, not on the region of its group ({p.layers[i - i % g]})"
            for i, r in enumerate(p.layers) if r != p.layers[i - i % g]]
    if len(p.layer_regions()) != cdiv(config.n_layers, g):
        out.append(f"{len(p.layer_regions())} distinct layer regions for {config.n_layers} layers in groups of {g}")
    if (p.head is None) != config.tie_embeddings:
        out.append(f"the head {'has' if p.head else 'has no'} region of its own, but the model's head is "
                   f"{'tied' if config.tie_embeddings else 'untied'}")
    if len({r.shape for r in p.layers}) > 1:
        out.append(f"layer regions differ in shape: {sorted({r.shape for r in p.layers})}")
    if p.layers[0].h > dl.max_layer_rows(config) or p.layers[0].w > config.dim:
        out.append(f"layer regions of {p.layers[0].h} rows x {p.layers[0].w} cols exceed "
                   f"{dl.max_layer_rows(config)} rows / {config.dim} cols")
    named = p.regions()
    for name, r in named:
        out += _region_faults(mesh, p.dead_links, name, r)
    for i, (a, ra) in enumerate(named):
        out += [f"{a} {ra} overlaps {b} {rb}" for b, rb in named[i + 1:] if ra.intersect(rb)]
    out += _sram_faults(p)
    if cores_in(p.spare, [r for _, r in named]) or p.spare & mesh.dead:
        out.append("spare cores overlap a region or a dead core")
    if [t for t, _ in p.tile_nodes] != sorted(mesh.tiles()):
        out.append("tile_nodes does not list every tile of the mesh exactly once, sorted")
    return tuple(out)


def stream_bytes(config: LlamaConfig, region: Region, tokens: int, requests: int, dtype: str) -> int | None:
    """The most loaded core of a streaming region (None: the shape cannot be split)."""
    try:
        return dl.most_bytes(dl.stream_booking(config, region, budget.kv_reserved(tokens, region.w), requests, dtype))
    except ValueError:
        return None


def _stream_faults(p: Placement) -> list[str]:
    r, config, out = p.embed, p.config, []
    if p.group != config.n_layers or any(q != r for q in p.layers):
        out.append(f"a streaming placement runs every stage on one region ({r}); its layers are on "
                   f"{sorted(set(p.layers))} in groups of {p.group}")
    out += _region_faults(p.mesh, p.dead_links, "the streaming region", r)
    if len(p.mesh.tiles_of(r)) != 1 or r.h > dl.max_layer_rows(config) or r.w > config.dim:
        out.append(f"the streaming region {r} must lie in one tile, with at most {dl.max_layer_rows(config)} rows and "
                   f"{config.dim} columns")
    need = stream_bytes(config, r, p.kv_tokens, p.kv.requests, p.dtype)
    if p.kv_tokens < p.kv.tokens or need is None or need > p.spec.sram_bytes:
        out.append(f"the streaming region {r} needs {need} bytes on a core (None: unsplittable) > "
                   f"{p.spec.sram_bytes}, or kv_tokens {p.kv_tokens} < {p.kv.tokens}")
    return out


def plan_streaming(config: LlamaConfig, spec: HardwareSpec, mesh: MeshSpec, *, kv: KVReserve,
                   options: PlanOptions = PlanOptions()) -> Placement:
    """The weight-streaming placement of `config` on `mesh` (dead cores: ``mesh.dead``), around
    ``options.dead_links``, in ``options.dtype``, over ``options.nodes`` (module docstring; one region runs
    every layer: the options' strategy and balance do not apply); PlanError says what would fit."""
    nodes, dead_links, dtype = options.nodes, options.dead_links, options.dtype
    work = _checked(config, spec, mesh, kv, dtype)
    _check_inputs(work, spec, mesh, nodes, dead_links)
    r = _stream_region(work, spec, mesh, dead_links, fits=True)
    if r is None:
        raise PlanError(_no_stream_message(work, spec, mesh, dead_links))
    p = Placement(config, spec, mesh, dtype, kv, (r,) * config.n_layers, r, frozenset(),
                  assign_nodes(mesh, [n.name for n in nodes], [n.cpus for n in nodes]),
                  budget.kv_reserved(kv.tokens, r.w), nodes, dead_links, config.n_layers, streaming=True)
    broken = violations(p)
    if broken:
        raise PlanError("weight streaming: the planner built a placement that breaks its own rules (a bug in "
                        "waferrt.scheduler, please report it): " + "; ".join(broken))
    return p


def _stream_region(work: Workload, spec: HardwareSpec, mesh: MeshSpec, links: frozenset, fits: bool
                   ) -> Region | None:
    """The streaming region: a rectangle inside one tile (at most dim columns, head_dim/2 rows) with no dead
    core nor dead link inside; the most cores first (the shortest compute), then the widest, the first tile
    (sorted TileIds) and the top-left position. `fits`: only one whose cores hold the streaming state
    (stream_bytes); else the largest free one. None: there is none."""
    config = work.config
    top_w = min(mesh.tile_w, mesh.width, config.dim)
    top_h = min(mesh.tile_h, mesh.height, dl.max_layer_rows(config))
    obstacles = Obstacles(mesh.width, mesh.height, mesh.dead, links)
    too_wide = [top_w + 1] * (top_h + 1)  # too_wide[h]: no free w x h rectangle in a tile from this width on
    narrowest = functools.cache(lambda h: _narrowest(config, spec, work.kv, work.dtype, h, top_w) if fits else 1)
    for w, h in sorted(((w, h) for w in range(1, top_w + 1) for h in range(1, top_h + 1)),
                       key=lambda s: (-s[0] * s[1], -s[0])):
        if w >= too_wide[h] or w < narrowest(h):
            continue
        ys, xs = np.nonzero(obstacles.free_map(w, h))
        tx, ty = xs // mesh.tile_w, ys // mesh.tile_h
        inside = ((xs + w - 1) // mesh.tile_w == tx) & ((ys + h - 1) // mesh.tile_h == ty)
        if inside.any():
            i = np.lexsort((xs[inside], ys[inside], ty[inside], tx[inside]))[0]
            return Region(int(xs[inside][i]), int(ys[inside][i]), w, h)
        for taller in range(h, top_h + 1):  # a taller one has no room either
            too_wide[taller] = min(too_wide[taller], w)
    return None


def _narrowest(config: LlamaConfig, spec: HardwareSpec, kv: KVReserve, dtype: str, h: int, top: int) -> int:
    """The fewest columns (<= top; top + 1: none) of an h-row region whose cores hold the streaming state. A
    core's share does not grow with the columns (tests/unit/test_streaming.py), so a binary search finds it."""
    def holds(w: int) -> bool:
        need = stream_bytes(config, Region(0, 0, w, h), kv.tokens, kv.requests, dtype)
        return need is not None and need <= spec.sram_bytes

    found = first_true(1, top, holds)
    return top + 1 if found is None else found


def _no_stream_message(work: Workload, spec: HardwareSpec, mesh: MeshSpec, links: frozenset) -> str:
    """Why no streaming region fits: what died, the largest region left, and the region it would take."""
    config, kv, dtype = work.config, work.kv, work.dtype
    lost = [*(f"core {c}" for c in sorted(mesh.dead)), *(f"link {a}-{b}" for a, b in sorted(links))]
    more = f" and {len(lost) - 6} more" if len(lost) > 6 else ""
    died = f"with {', '.join(lost[:6])}{more} dead, " if lost else ""
    best = _stream_region(work, spec, mesh, links, fits=False)
    need = None if best is None else stream_bytes(config, best, kv.tokens, kv.requests, dtype)
    has = ("no live core is left" if best is None else f"the largest, {best}, needs {need} bytes on a core"
           + (" (it cannot be split)" if need is None else ""))
    head = (f"weight streaming: {died}no region inside one {mesh.tile_w}x{mesh.tile_h} tile of the "
            f"{mesh.width}x{mesh.height} mesh "
            f"{'that avoids them ' if lost else ''}holds every layer's K/V ({kv.tokens} tokens x {kv.requests} "
            f"requests), the double buffer and the scratch ({dtype}) in the {spec.sram_bytes} bytes of a core (a "
            f"region has at most {config.dim} columns and {dl.max_layer_rows(config)} rows): {has}")
    try:
        small = streaming_mesh(config, spec, kv, dtype)
    except PlanError:
        return head + "; no region of any size holds it: use fewer --kv-tokens or --requests"
    room = "a mesh with another tile, or " if lost else ""
    return (head + f"; it takes a region of {small.width}x{small.height} cores, free of dead cores and links, "
            f"inside one tile: use {room}a wider tile (--tile {small.width}x{small.height}), or fewer --kv-tokens "
            "or --requests")


def streaming_mesh(config: LlamaConfig, spec: HardwareSpec, kv: KVReserve, dtype: str = "float32") -> MeshSpec:
    """The one-tile mesh of head_dim/2 rows and the fewest columns whose streaming region fits in SRAM."""
    h = dl.max_layer_rows(config)
    for w in range(1, config.dim + 1):
        need = stream_bytes(config, Region(0, 0, w, h), kv.tokens, kv.requests, dtype)
        if need is not None and need <= spec.sram_bytes:
            return MeshSpec(w, h, w, h)
    raise PlanError(f"weight streaming: no region of {h} rows and at most {config.dim} columns holds every layer's K/V "
                    f"({kv.tokens} tokens x {kv.requests} requests) and a double buffer in {spec.sram_bytes} bytes "
                    "per core: lower --kv-tokens or --requests")


def _sram_faults(p: Placement) -> list[str]:
    config, sram, out = p.config, p.spec.sram_bytes, []
    if p.kv_tokens < p.kv.tokens:
        out.append(f"kv_tokens {p.kv_tokens} is less than the reserve of {p.kv.tokens}")
    for name, r in p.layer_regions():
        layers = sum(1 for q in p.layers if q == r)
        need = budget.layer_bytes(Workload(config, KVReserve(p.kv_tokens, p.kv.requests), p.dtype, layers), r.w, r.h)
        if need is None or need > sram:
            out.append(f"{name} {r} needs {need} bytes on a core (None: unsplittable) > {sram}")
    for name, r in (("embedding", p.embed), ("head", p.head)):
        need = None if r is None else budget.embed_bytes(config, r.w, r.h, p.dtype)
        if r is not None and (need is None or need > sram):
            out.append(f"{name} {r} needs {need} bytes on a core (None: unsplittable) > {sram}")
    return out


def _region_faults(mesh: MeshSpec, links, name: str, r: Region) -> list[str]:
    if not mesh.region.covers(r):
        return [f"{name} {r} is not inside the {mesh.width}x{mesh.height} mesh"]
    out = [f"{name} {r} uses dead core {c}" for c in sorted(mesh.dead) if r.contains(c)]
    return out + [f"{name} {r} contains dead link {a}-{b}" for a, b in sorted(links)
                  if link_inside(r, a, b)]


def _checked(config: LlamaConfig, spec: HardwareSpec, mesh: MeshSpec, kv: KVReserve, dtype: str) -> Workload:
    """plan()'s arguments checked one by one (each named), as the Workload the budgets take."""
    for what, value, kind in (("config", config, LlamaConfig), ("spec", spec, HardwareSpec),
                              ("mesh", mesh, MeshSpec), ("kv", kv, KVReserve)):
        if not isinstance(value, kind):
            raise TypeError(f"plan(): {what} must be a {kind.__name__}, got {value!r}")
    if dtype not in STORAGE_DTYPES:
        raise PlanError(f"unknown storage dtype {dtype!r}; use one of {', '.join(STORAGE_DTYPES)}")
    return Workload(config, kv, dtype)


def _check_inputs(work: Workload, spec: HardwareSpec, mesh: MeshSpec, nodes, dead_links) -> None:
    check_on_wafer(mesh, spec)  # MeshTooLarge: its arrays would not fit the host's memory either
    if not nodes or len({n.name for n in nodes}) != len(nodes):
        raise PlanError(f"give at least one Ray node, each with a distinct name; got {list(nodes)}")
    try:
        check_links(mesh, dead_links)
    except ValueError as e:
        raise PlanError(str(e)) from None


def plan(config: LlamaConfig, spec: HardwareSpec, mesh: MeshSpec, *, kv: KVReserve,
         options: PlanOptions = PlanOptions()) -> Placement:
    """Place `config` on `mesh` (dead cores: ``mesh.dead``) in regions of ``options.strategy.group`` layers
    (default: one layer per region), around ``options.dead_links``, over the Ray ``options.nodes``, in
    ``options.dtype``; see the module docstring for the rules.
    ``options.balance`` (default) spreads the layers over the tiles so that the busiest tile holds the fewest
    weight bytes; False fills every tile to capacity in chain order (the busiest tiles do the most).

    >>> from waferrt.core.mesh import MeshSpec
    >>> from waferrt.core.spec import TINY
    >>> from waferrt.model import tiny_config
    >>> p = plan(tiny_config(), TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(tokens=32, requests=2))
    >>> len(p.layers), p.layers[0].shape, p.kv_tokens >= 32      # 3 layers, each on (rows, cols) cores
    (3, (3, 4), True)
    >>> violations(p)
    ()
    """
    nodes, dead_links, dtype, balance = options.nodes, options.dead_links, options.dtype, options.balance
    work = _checked(config, spec, mesh, kv, dtype)
    _check_inputs(work, spec, mesh, nodes, dead_links)
    g = _group(config, options.strategy)
    work = replace(work, layers=g, attention=options.attention)
    found = search.best_layout(work, spec, mesh, dead_links, balance)
    if found.layers is None:
        raise PlanError(_no_fit_message(work, spec, mesh, found.reason))
    names, cpus = [n.name for n in nodes], [n.cpus for n in nodes]
    kv_tokens = budget.region_kv_capacity(work, found.layers[0], spec.sram_bytes)
    layers = tuple(found.layers[i // g] for i in range(config.n_layers))
    p = Placement(config, spec, mesh, dtype, kv, layers, found.embed,
                  frozenset(c for r in found.spare for c in r.cores()),
                  assign_nodes(mesh, names, cpus), kv_tokens, nodes, dead_links, g, head=found.head)
    broken = violations(p)
    if broken:
        raise PlanError("the planner built a placement that breaks its own rules (a bug in waferrt.scheduler,"
                        " please report it): " + "; ".join(broken))
    return p


def _group(config: LlamaConfig, strategy: Strategy | None) -> int:
    if strategy is None:
        return 1
    if not isinstance(strategy, Strategy) or strategy.n_layers != config.n_layers:
        raise TypeError(f"plan(): strategy must be a Strategy(group, {config.n_layers}) for this model's "
                        f"{config.n_layers} layers (e.g. Strategy({config.n_layers}, {config.n_layers}): one region "
                        f"runs every layer), got {strategy!r}")
    return strategy.group


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _no_fit_message(work: Workload, spec: HardwareSpec, mesh: MeshSpec, reason: str) -> str:
    config, kv, dtype, group = work.config, work.kv, work.dtype, work.layers
    weights, kv_bytes = budget.model_bytes(config, kv.tokens, kv.requests, dtype)
    live = mesh.width * mesh.height - len(mesh.dead)
    how = "" if group == 1 else f" as {Strategy(group, config.n_layers).describe()}"
    head = (f"the model ({config.n_layers} layers, dim {config.dim}, vocab {config.vocab_size}) does not fit{how} "
            f"on the mesh {mesh} at spec {spec.name} with a KV reserve of {kv.tokens} tokens x "
            f"{kv.requests} requests ({dtype}): it needs at least {_mb(weights + kv_bytes)} (weights "
            f"{_mb(weights)} + KV reserve {_mb(kv_bytes)}, before activations); the mesh holds "
            f"{_mb(live * spec.sram_bytes)} ({live} live cores x {spec.sram_bytes} bytes). {reason}")
    if reason.startswith("no mesh"):
        return head
    best = search.smallest_mesh(work, spec, mesh.tile)
    if best is None:
        return (head + f" Even the whole {spec.name} wafer ({spec.full_mesh}) cut "
                f"in {mesh.tile_w}x{mesh.tile_h} tiles does not hold it: lower the KV reserve, use a "
                "smaller dtype, or a spec with more SRAM.")
    dead = " (a healthy one; yours has dead cores)" if mesh.dead else ""
    return (head + f" The smallest mesh of {mesh.tile_w}x{mesh.tile_h} tiles that holds it at this spec"
            f"{dead} is {best.width}x{best.height} ({best.tiles_x}x{best.tiles_y} tiles): use "
            f"--mesh {best.width}x{best.height} --tile {mesh.tile_w}x{mesh.tile_h}.")


@dataclass(frozen=True)
class MeshTry:
    """One mesh ``default_mesh`` tried: ``plan`` placed the model on it (`planned`), the way it wants (`wanted`)."""

    mesh: MeshSpec
    planned: bool
    wanted: bool


def mesh_tries(config: LlamaConfig, spec: HardwareSpec, kv: KVReserve, tiles: Extent = DEFAULT_TILES,
               spare_layers: int = 8, options: PlanOptions = PlanOptions()) -> Iterator[MeshTry]:
    """Every mesh ``default_mesh`` tries, in its order (its arguments), each as a MeshTry: whether ``plan``
    placed the model there, and whether that placement is the one wanted (every region inside one tile,
    spare slots for `spare_layers`). A caller with a deadline (the CLI) stops when it has waited enough."""
    dtype, g = options.dtype, _group(config, options.strategy)
    spare = spare_layers // g
    for grid in dict.fromkeys([tiles] + ([Extent(1, 2), Extent(2, 1), Extent(1, 1)] if tiles == DEFAULT_TILES else [])):
        for tile in search.tile_candidates(Workload(config, kv, dtype, g, options.attention), spec, grid, spare):
            mesh = MeshSpec.tiled(grid, tile)
            try:
                p = plan(config, spec, mesh, kv=kv, options=options)
            except PlanError:
                yield MeshTry(mesh, planned=False, wanted=False)
                continue
            yield MeshTry(mesh, True, plan_report(p).straddling == 0 and len(p.spare) >= spare * p.layers[0].size)


def no_default_mesh(spec: HardwareSpec, kv: KVReserve, tiles: Extent = DEFAULT_TILES) -> PlanError:
    """The error of a search that found no mesh."""
    return PlanError(f"no mesh of {tiles} tiles holds the model with every region inside one "
                     f"tile at spec {spec.name} and KV {kv.tokens}x{kv.requests}; ask for more tiles, "
                     "a smaller KV reserve or fewer spare layers")


def default_mesh(config: LlamaConfig, spec: HardwareSpec, kv: KVReserve, tiles: Extent = DEFAULT_TILES,
                 spare_layers: int = 8, options: PlanOptions = PlanOptions()) -> MeshSpec:
    """The smallest mesh of `tiles` (width x height) equal tiles where every region lies inside one tile (planned
    with ``options``: its dtype and strategy) and
    free region-shaped slots for `spare_layers` layers (spare_layers // group slots) remain for repair.
    Eight spare slots let SmolLM2 at wse2 re-plan around 10 random dead cores (which hit ~7 layers and often
    the embedding). When no such mesh of 2x2 tiles is on the wafer (regions of many layers are wide), 1x2,
    2x1 and 1x1 tiles are tried (``mesh_tries``, unbounded: a model far smaller than the spec's cores may
    try thousands; the CLI bounds it in time)."""
    for t in mesh_tries(config, spec, kv, tiles, spare_layers, options):
        if t.wanted:
            return t.mesh
    raise no_default_mesh(spec, kv, tiles)
