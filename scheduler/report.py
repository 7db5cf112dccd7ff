"""What a Placement achieves, as numbers: SRAM per core, hops, tile and node crossings, modelled speed.

Contract: ``plan_report(placement) -> PlanReport`` is pure. :class:`PlanReport` is frozen and holds only
plain values. Layers stacked in one region (``Placement.group``) are one region here: its SRAM holds all of
them, the hand-overs between them move nothing, and its stage time is theirs together. SRAM figures are per
core over the cores that regions use, at the placement's KV capacity (``placement.kv_tokens`` positions for
each of ``kv.requests`` requests). The modelled step is one token through the whole chain: embedding row ->
layer 0 -> ... -> layer L-1 -> head, with the hand-overs between regions (``waferrt.decode.cost``); the
speed is the one model of it, the flow schedule (``speed.placement_seconds``: ``kv.requests`` requests in
flight, each at its own pace), and ``bound_tokens_per_s`` a bound derived from the same cycles (a token per
busiest-region time at most).
``tile_work`` is the decode work of every tile (one process each): the weight bytes of the regions it hosts
(the embedding table once for embedding and head; a region over several tiles counted in proportion to its
cores in each), which the decode reads once per step, so the busiest tile bounds the emulator's throughput."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import pairwise

from waferrt.core.mesh import Region
from waferrt.decode.layout import booked_bytes, embed_booking, layer_booking

from .budget import work_bytes
from .geometry import node_borders, shares, tile_box, tile_bytes, tiles_spanned
from .speed import placement_seconds, placement_stages, stages_alone_cycles
from .types import Placement


@dataclass(frozen=True)
class TileWork:
    """One tile's share of the decode: the layer regions it holds (wholly or partly), whether it holds
    (part of) the embedding/head, and the weight bytes of its regions."""

    tile: tuple[int, int]  # (tx, ty)
    layers: int
    embed: bool
    weight_bytes: int


@dataclass(frozen=True)
class PlanReport:
    layer_shape: tuple[int, int]  # (cols, rows) of every layer region
    embed_shape: tuple[int, int]  # (cols, rows) of the embedding/head region
    used_cores: int
    spare_cores: int
    free_cores: int  # live cores in no region and not kept as spare
    dead_cores: int
    sram_bytes: int  # capacity of one core
    sram_min: int  # bytes, over the used cores
    sram_mean: float
    sram_max: int
    layer_core_bytes: tuple[int, ...]  # most loaded core of each layer region (in chain order)
    embed_core_bytes: int
    hops: tuple[int, ...]  # layer region i -> region i+1, nearest cores (1 when they touch)
    embed_hops: tuple[int, int]  # embedding -> layer 0, layer L-1 -> head
    tile_handovers: int  # hand-overs of the chain that cross a tile border
    straddling: int  # regions that straddle a tile border
    node_borders: int  # tile borders that separate two Ray nodes
    kv_tokens: int  # positions per request per layer
    kv_requests: int
    step_cycles: float  # one token through the whole chain
    bound_stage_cycles: float  # the busiest region's cycles per token (its stages, the hand-overs into them)
    clock_hz: float
    tokens_per_s: float  # with kv_requests requests in flight (the flow schedule)
    request_tokens_per_s: float  # one request alone
    tile_work: tuple[TileWork, ...] = ()  # every tile of the mesh, sorted by (ty, tx)
    layers_per_region: int = 1  # the placement's strategy (Placement.group)

    @property
    def tile_imbalance(self) -> float:
        """Busiest tile's weight bytes over the mean per tile (1.0: perfectly balanced)."""
        total = sum(t.weight_bytes for t in self.tile_work)
        return max(t.weight_bytes for t in self.tile_work) * len(self.tile_work) / total if total else 1.0

    def bound_tokens_per_s(self, in_flight: int) -> float:
        """A bound of the modelled decode rate with `in_flight` requests at the full K/V reserve (every request
        holding kv_tokens positions; never below the flow schedule's there): each advances one token per trip
        through the chain, and no more than one token can enter per busiest-region time. A run of shorter
        requests can beat it: its bound is speed.run_bound_tokens_per_s, at the positions its tokens held."""
        return self.clock_hz * min(in_flight / self.step_cycles, 1.0 / self.bound_stage_cycles)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_tokens * self.kv_requests

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["kv_capacity_tokens"] = self.kv_capacity_tokens
        out["tile_imbalance"] = self.tile_imbalance
        return out

    def text(self) -> str:
        kb = 1024
        hop_note = "all touch" if set(self.hops) <= {1} else f"max {max(self.hops, default=0)}"
        return "\n".join([
            f"layer regions   {self.layer_shape[0]}x{self.layer_shape[1]} cores (cols x rows)"
            + (f", {self.layers_per_region} layers each" if self.layers_per_region > 1 else "")
            + f", embedding/head {self.embed_shape[0]}x{self.embed_shape[1]}",
            f"cores           {self.used_cores} used, {self.spare_cores} spare, {self.free_cores} free, "
            f"{self.dead_cores} dead",
            f"SRAM per core   min {self.sram_min / kb:.1f} KB, mean {self.sram_mean / kb:.1f} KB, "
            f"max {self.sram_max / kb:.1f} KB of {self.sram_bytes / kb:.0f} KB",
            f"hops layer->layer {sum(self.hops)} over {len(self.hops)} hand-overs ({hop_note}); "
            f"embedding->layer 0: {self.embed_hops[0]}, last layer->head: {self.embed_hops[1]}",
            f"tile borders    {self.tile_handovers} hand-overs cross a tile border, {self.straddling} "
            f"regions straddle one, {self.node_borders} tile borders cross Ray nodes",
            f"KV capacity     {self.kv_tokens} tokens x {self.kv_requests} requests per layer "
            f"({self.kv_capacity_tokens} tokens)",
            f"modelled decode {self.step_cycles:,.0f} cycles per token through the chain; "
            f"{self.tokens_per_s:,.0f} tokens/s with {self.kv_requests} requests in flight, "
            f"{self.request_tokens_per_s:,.0f} tokens/s for one request",
            f"tile work       weight bytes per tile (one process each), busiest "
            f"{self.tile_imbalance:.2f}x the mean: " + ", ".join(
                f"({t.tile[0]},{t.tile[1]}) {'embed+' if t.embed else ''}{t.layers} layers "
                f"{t.weight_bytes / 1e6:,.1f} MB" for t in self.tile_work),
        ])


def _tile_work(p: Placement) -> tuple[TileWork, ...]:
    mesh = p.mesh
    nbytes = tile_bytes(mesh, p.tables(), p.layers, *work_bytes(p.config, p.dtype))
    layers = [0] * len(nbytes)
    for r in p.layers:
        for tx, ty, _ in shares(mesh, r):
            layers[ty * mesh.tiles_x + tx] += 1
    embed = {ty * mesh.tiles_x + tx for t in p.tables() for tx, ty, _ in shares(mesh, t)}
    return tuple(TileWork((t.tx, t.ty), layers[i], i in embed, nbytes[i]) for i, t in enumerate(mesh.tiles()))


def _layer_regions(p: Placement) -> list[Region]:
    """Every layer region once, in chain order."""
    return [r for _, r in p.layer_regions()]


def _sram(p: Placement) -> tuple[int, float, int, tuple[int, ...], int]:
    config, dtype = p.config, p.dtype
    per_core = [sum(booked_bytes(layer_booking(config, r, p.kv_tokens, p.kv.requests, dtype, p.layers.count(r))
                                 ).values()) for r in _layer_regions(p)]
    tables = [sum(booked_bytes(embed_booking(config, t, dtype)).values()) for t in p.tables()]
    every = per_core + tables
    mean = sum(float(a.sum()) for a in every) / sum(a.size for a in every)
    lo, hi = min(int(a.min()) for a in every), max(int(a.max()) for a in every)
    return lo, mean, hi, tuple(int(a.max()) for a in per_core), max(int(a.max()) for a in tables)


def _speed(p: Placement) -> tuple[float, float, float]:
    """(seconds of one request's token, of a round of kv.requests tokens: the flow schedule; the busiest
    region's cycles per token, from the same cycles: its stages and the hand-overs into them)."""
    one, round_s = placement_seconds(p)
    if p.streaming:  # one region runs every stage
        return one, round_s, one * p.spec.clock_hz
    stages = placement_stages(p)
    region: dict[Region, float] = {}
    for st, c in zip(stages, stages_alone_cycles(p.spec, p.decoding, stages, p.kv_tokens), strict=True):
        region[st.region] = region.get(st.region, 0.0) + c
    return one, round_s, max(region.values())


def plan_report(p: Placement) -> PlanReport:
    """What placement `p` achieves: SRAM per core, hops, tile and node crossings, modelled speed."""
    mesh = p.mesh
    regions = _layer_regions(p)
    chain = (p.embed, *regions, p.head_region)
    placed = (p.embed, *regions, *p.tables()[1:])
    used = sum(r.size for r in placed)
    lo, mean, hi, per_layer, embed_bytes = _sram(p)
    one, round_s, stage = _speed(p)
    clock = p.spec.clock_hz
    shape = p.layers[0]
    return PlanReport(
        layer_shape=(shape.w, shape.h), embed_shape=(p.embed.w, p.embed.h),
        used_cores=used, spare_cores=len(p.spare), dead_cores=len(mesh.dead),
        free_cores=mesh.width * mesh.height - len(mesh.dead) - used - len(p.spare),
        sram_bytes=p.spec.sram_bytes, sram_min=lo, sram_mean=mean, sram_max=hi,
        layer_core_bytes=per_layer, embed_core_bytes=embed_bytes,
        hops=tuple(a.hops_to(b) for a, b in pairwise(regions)),
        embed_hops=(p.embed.hops_to(p.layers[0]), p.layers[-1].hops_to(p.head_region)),
        tile_handovers=sum(tile_box(mesh, a) != tile_box(mesh, b) for a, b in pairwise(chain)),
        straddling=sum(tiles_spanned(mesh, r) > 1 for r in placed),
        node_borders=node_borders(mesh, p.tile_nodes),
        kv_tokens=p.kv_tokens, kv_requests=p.kv.requests,
        step_cycles=one * clock, bound_stage_cycles=stage, clock_hz=clock,
        tokens_per_s=p.kv.requests / round_s, request_tokens_per_s=1.0 / one,
        tile_work=_tile_work(p), layers_per_region=p.group,
    )
