"""The Placement: where every tensor of a Llama model sits on the mesh, and the planner that makes it.

Contract (pure: no Ray, returns immutable data):

- Inputs are frozen values: ``LlamaConfig``, ``HardwareSpec``, ``MeshSpec`` (its ``dead`` cores),
  :class:`KVReserve` (tokens x requests per layer), Ray nodes as :class:`NodeInfo`, dead links.
- ``plan(...) -> Placement``: every layer gets a rectangle of live cores, all layers the same shape
  (rows <= head_dim/2, columns <= dim), the fewest cores that hold its weights + KV reserve + scratch in
  SRAM (sizes from ``waferrt.decode_layout``); the tied embedding + final norm + head get one more
  region. Regions are packed inside tiles when they fit in one, consecutive layers touch (a serpentine
  of shelves inside a tile, continued into the neighbouring tile), and tiles go to Ray nodes in
  contiguous runs. The layers are spread over the tiles so that the decode work of the busiest tile
  (the weight bytes of its regions, ``budget.work_bytes``; one process per tile) is as small as it can
  be: each tile takes its balanced share of the chain and the chain moves on to the next tile (spare
  slots spread over the tiles); straddling regions still rank first. A model that does not fit raises
  :class:`PlanError` with the bytes needed, the bytes available and the smallest mesh (at this spec and
  tile size) that holds it.
- :class:`Placement` is frozen and hashable; ``report()`` measures it, ``violations()`` lists broken
  rules (empty for anything ``plan`` returns), ``to_json()`` / ``Placement.from_json`` round-trip.
- ``default_mesh(config, spec, kv)``: the smallest mesh of 2x2 tiles holding the model with every
  region inside one tile and spare layer slots for repair.

Re-planning around failures is :func:`waferrt.scheduler.repair.replan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from waferrt import decode_layout as dl
from waferrt.layout import Layout
from waferrt.mesh import Coord, MeshSpec, Region, TileId
from waferrt.model.config import LlamaConfig
from waferrt.spec import HardwareSpec

from . import budget, search
from .geometry import assign_nodes, check_links, cores_in, link_inside
from .report import PlanReport, build_report


class PlanError(ValueError):
    """The model cannot be placed as asked; the message says why and what would work."""


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node that hosts tile actors."""

    name: str
    cpus: int

    def __post_init__(self) -> None:
        if not self.name or self.cpus < 1:
            raise ValueError(f"a Ray node needs a name and at least 1 CPU, got {self.name!r} with "
                             f"{self.cpus}")


@dataclass(frozen=True)
class KVReserve:
    """KV cache to reserve in every layer region: `tokens` positions for each of `requests` requests."""

    tokens: int
    requests: int

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.requests < 1:
            raise ValueError(f"KV reserve needs tokens >= 1 and requests >= 1, got {self.tokens} tokens x "
                             f"{self.requests} requests")


DEFAULT_NODES = (NodeInfo("local", 2),)


@dataclass(frozen=True)
class Placement:
    config: LlamaConfig
    spec: HardwareSpec
    mesh: MeshSpec
    dtype: str
    kv: KVReserve
    layers: tuple[Region, ...]  # layer i -> its region
    embed: Region  # tied embedding table + final norm + output head
    spare: frozenset[Coord]  # whole free layer-shaped slots kept for repair (up to one per layer)
    tile_nodes: tuple[tuple[TileId, str], ...]  # sorted by tile
    nodes: tuple[NodeInfo, ...] = DEFAULT_NODES
    dead_links: frozenset[tuple[Coord, Coord]] = frozenset()

    def node_of(self, tile: TileId) -> str:
        for t, name in self.tile_nodes:
            if t == tile:
                return name
        raise ValueError(f"{tile} is not a tile of this placement's mesh ({self.mesh})")

    def layer_layouts(self, i: int) -> dict[str, Layout]:
        """The decode layouts of layer i's weights over its region."""
        return dl.layer_layouts(self.config, self.layers[i], self.dtype)

    def kv_layout(self, i: int) -> Layout:
        """Layout of one request's K (or V) cache of layer i, at the full capacity ``kv_tokens``."""
        return dl.kv_layout(self.config, self.layers[i], self.kv_tokens, self.dtype)

    @cached_property
    def kv_tokens(self) -> int:
        """KV positions per request per layer that every layer region holds: at least the reserve, more
        when the region's SRAM has room (capped at the model's max_seq_len)."""
        return budget.kv_capacity(self.config, self.layers[0], self.spec.sram_bytes, self.kv.tokens,
                                  self.kv.requests, self.dtype)

    def report(self) -> PlanReport:
        return build_report(self)

    def regions(self) -> tuple[tuple[str, Region], ...]:
        """('embed', region) then ('layer i', region) for every layer."""
        return (("embed", self.embed),) + tuple((f"layer {i}", r) for i, r in enumerate(self.layers))

    def violations(self) -> tuple[str, ...]:
        """Every rule this placement breaks, in words (empty when it is sound)."""
        cfg, mesh, out = self.config, self.mesh, []
        if len(self.layers) != cfg.n_layers or not self.layers:
            return (f"{len(self.layers)} layer regions for a model of {cfg.n_layers} layers",)
        if len({r.shape for r in self.layers}) > 1:
            out.append(f"layer regions differ in shape: {sorted({r.shape for r in self.layers})}")
        if self.layers and (self.layers[0].h > dl.max_layer_rows(cfg) or self.layers[0].w > cfg.dim):
            out.append(f"layer regions of {self.layers[0].h} rows x {self.layers[0].w} cols exceed "
                       f"{dl.max_layer_rows(cfg)} rows / {cfg.dim} cols")
        named = self.regions()
        for name, r in named:
            out += _region_faults(mesh, self.dead_links, name, r)
        for i, (a, ra) in enumerate(named):
            out += [f"{a} {ra} overlaps {b} {rb}" for b, rb in named[i + 1:] if ra.intersect(rb)]
        out += self._sram_faults()
        if cores_in(self.spare, [r for _, r in named]) or self.spare & mesh.dead:
            out.append("spare cores overlap a region or a dead core")
        if [t for t, _ in self.tile_nodes] != sorted(mesh.tiles()):
            out.append("tile_nodes does not list every tile of the mesh exactly once, sorted")
        return tuple(out)

    def _sram_faults(self) -> list[str]:
        cfg, sram, out = self.config, self.spec.sram_bytes, []
        for i, r in enumerate(self.layers):
            need = budget.layer_bytes(cfg, r.w, r.h, self.kv_tokens, self.kv.requests, self.dtype)
            if need is None or need > sram:
                out.append(f"layer {i} {r} needs {need} bytes on a core (None: unsplittable) > {sram}")
        need = budget.embed_bytes(cfg, self.embed.w, self.embed.h, self.dtype)
        if need is None or need > sram:
            out.append(f"embedding {self.embed} needs {need} bytes on a core (None: unsplittable) > {sram}")
        return out

    def to_json(self) -> dict:
        from .serial import placement_to_json

        return placement_to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> Placement:
        from .serial import placement_fields

        return cls(**placement_fields(d))


def _region_faults(mesh: MeshSpec, links, name: str, r: Region) -> list[str]:
    if not mesh.region.covers(r):
        return [f"{name} {r} is not inside the {mesh.width}x{mesh.height} mesh"]
    out = [f"{name} {r} uses dead core {c}" for c in sorted(mesh.dead) if r.contains(c)]
    return out + [f"{name} {r} contains dead link {a}-{b}" for a, b in sorted(links)
                  if link_inside(r, (a, b))]


def _check_inputs(config: LlamaConfig, mesh: MeshSpec, nodes, dtype: str, dead_links) -> None:
    if not config.tie_embeddings:
        raise PlanError("this model has an untied output head; the decode layout (waferrt/decode_layout.py) "
                        "places one tied embedding/head table, so only tied-embedding models can be planned")
    if not nodes or len({n.name for n in nodes}) != len(nodes):
        raise PlanError(f"give at least one Ray node, each with a distinct name; got {list(nodes)}")
    try:
        budget.tensor_bytes(config, dtype)
    except TypeError:
        raise PlanError(f"unknown storage dtype {dtype!r}; use a numpy dtype name such as float32 or "
                        "float16") from None
    try:
        check_links(mesh, dead_links)
    except ValueError as e:
        raise PlanError(str(e)) from None


def plan(config: LlamaConfig, spec: HardwareSpec, mesh: MeshSpec, *, kv: KVReserve,
         nodes: tuple[NodeInfo, ...] = DEFAULT_NODES, dtype: str = "float32",
         dead_links: frozenset[tuple[Coord, Coord]] = frozenset(), balance: bool = True) -> Placement:
    """Place `config` on `mesh` (dead cores: ``mesh.dead``); see the module docstring for the rules.
    `balance` (default) spreads the layers over the tiles so that the busiest tile holds the fewest
    weight bytes; False fills every tile to capacity in chain order (the busiest tiles do the most)."""
    nodes, dead_links = tuple(nodes), frozenset(dead_links)
    _check_inputs(config, mesh, nodes, dtype, dead_links)
    found = search.best_layout(config, spec, mesh, kv.tokens, kv.requests, dtype, dead_links, balance)
    if found.layers is None:
        raise PlanError(_no_fit_message(config, spec, mesh, kv, dtype, found.reason))
    names, cpus = [n.name for n in nodes], [n.cpus for n in nodes]
    p = Placement(config, spec, mesh, dtype, kv, found.layers, found.embed,
                  frozenset(c for r in found.spare for c in r.cores()),
                  assign_nodes(mesh, names, cpus), nodes, dead_links)
    broken = p.violations()
    if broken:
        raise PlanError("the planner built a placement that breaks its own rules (a bug in waferrt.scheduler,"
                        " please report it): " + "; ".join(broken))
    return p


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _no_fit_message(config: LlamaConfig, spec: HardwareSpec, mesh: MeshSpec, kv: KVReserve, dtype: str,
                    reason: str) -> str:
    weights, kv_bytes = budget.model_bytes(config, kv.tokens, kv.requests, dtype)
    live = mesh.width * mesh.height - len(mesh.dead)
    head = (f"the model ({config.n_layers} layers, dim {config.dim}, vocab {config.vocab_size}) does not fit "
            f"on the mesh {mesh} at spec {spec.name} with a KV reserve of {kv.tokens} tokens x "
            f"{kv.requests} requests ({dtype}): it needs at least {_mb(weights + kv_bytes)} (weights "
            f"{_mb(weights)} + KV reserve {_mb(kv_bytes)}, before activations); the mesh holds "
            f"{_mb(live * spec.sram_bytes)} ({live} live cores x {spec.sram_bytes} bytes). {reason}")
    if reason.startswith("no mesh"):
        return head
    best = search.smallest_mesh(config, spec, (mesh.tile_w, mesh.tile_h), kv.tokens, kv.requests, dtype)
    if best is None:
        return (head + f" Even the whole {spec.name} wafer ({spec.full_mesh[0]}x{spec.full_mesh[1]}) cut "
                f"in {mesh.tile_w}x{mesh.tile_h} tiles does not hold it: lower the KV reserve, use a "
                "smaller dtype, or a spec with more SRAM.")
    dead = " (a healthy one; yours has dead cores)" if mesh.dead else ""
    return (head + f" The smallest mesh of {mesh.tile_w}x{mesh.tile_h} tiles that holds it at this spec"
            f"{dead} is {best.width}x{best.height} ({best.tiles_x}x{best.tiles_y} tiles): use "
            f"--mesh {best.width}x{best.height} --tile {mesh.tile_w}x{mesh.tile_h}.")


def default_mesh(config: LlamaConfig, spec: HardwareSpec, kv: KVReserve, tiles: tuple[int, int] = (2, 2),
                 dtype: str = "float32", spare_layers: int = 8) -> MeshSpec:
    """The smallest mesh of tiles[0] x tiles[1] equal tiles where every region lies inside one tile and
    at least `spare_layers` free layer-shaped slots remain for repair. Eight spare slots let SmolLM2 at
    wse2 re-plan around 10 random dead cores (which hit ~7 layers and often the embedding)."""
    for tile in search.tile_candidates(config, spec, kv.tokens, kv.requests, dtype, tiles, spare_layers):
        mesh = MeshSpec(tiles[0] * tile[0], tiles[1] * tile[1], *tile)
        try:
            p = plan(config, spec, mesh, kv=kv, dtype=dtype)
        except PlanError:
            continue
        r = p.report()
        if r.straddling == 0 and len(p.spare) >= spare_layers * p.layers[0].size:
            return mesh
    raise PlanError(f"no mesh of {tiles[0]}x{tiles[1]} tiles holds the model with every region inside one "
                    f"tile at spec {spec.name} and KV {kv.tokens}x{kv.requests}; ask for more tiles, "
                    "a smaller KV reserve or fewer spare layers")
