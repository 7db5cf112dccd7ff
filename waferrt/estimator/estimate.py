"""The whole wafer on paper: plan a model at full-wafer scale analytically and estimate its decode speed.

Contract (pure): ``estimate(config, spec, mesh, kv, dtype, Objective(goal, tried))`` returns an
:class:`~waferrt.estimator.estimate_report.Estimate`. For each strategy in `tried` (``types.Strategy``:
layers per region; what ``strategies.parse_strategy`` reads from ``--strategy``) it searches the
layer-region shapes in closed form (``wafer.row_options`` x a few column counts between the narrowest
that fits in SRAM and the widest whose regions all fit on the floor plan), times
each with the emulator's own closed forms (``waferrt.decode.cost.step_cycles``:
every request at its own pace (``decode.schedule``), stages pipelined, hand-overs between
regions) and keeps the best for the objective: "latency" (time per token of one request) or "throughput"
(tokens/s with ``kv.requests`` in flight). Without `tried` it tries layer, tensor and a few grouped
strategies (``scheduler.strategies.worth_trying``); with more than one it says why the winner won (and which kinds it
was limited to), with exactly one that it was asked for. When nothing fits it says so and what would
(``advice``). The host exchange (token ids in, logits out over ``spec.ingress_bytes_per_s``) is added per
step; the emulator books none. The closed forms are given :func:`paper_decoding`: an MoE layer's experts at
their expected routing (decode.decoding.Routing.EXPECTED), not a zero router's typical token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from waferrt.core.cost import cycles_seconds
from waferrt.core.dtypes import STORAGE_DTYPES
from waferrt.core.mesh import Extent
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import head_decode_parts, layer_decode_parts, stage_handover
from waferrt.decode.decoding import Decoding, Routing
from waferrt.decode.schedule import requests_round_seconds, round_bound_seconds
from waferrt.decode.stage import Stage, StageKind
from waferrt.model.config import LlamaConfig
from waferrt.scheduler.speed import stages_alone_cycles
from waferrt.scheduler.strategies import explain, worth_trying
from waferrt.scheduler.types import KVReserve, Objective, Strategy, Workload

from . import wafer
from .advice import advice
from .estimate_report import Estimate, breakdown_seconds


def paper_decoding(config: LlamaConfig, dtype: str, head_groups: int) -> Decoding:
    """What the estimator gives the decode's closed forms: the model, its dtype, the layer regions' head
    groups, and an MoE's expected routing (the one owner of that choice: estimate, streaming, sparse, prefill)."""
    return Decoding(config, dtype, head_groups=head_groups, routing=Routing.EXPECTED)


@dataclass(frozen=True)
class Candidate:
    """One strategy on one floor plan, timed."""

    strategy: Strategy
    floor: wafer.Floor
    latency_s: float  # one request's token through every stage (wafer only)
    step_s: float  # one step of kv.requests requests in flight, micro-batched and pipelined (wafer only)
    requests: int

    @property
    def tokens_per_s(self) -> float:
        return self.requests / self.step_s

    def score(self, objective: str) -> float:
        """Lower is better."""
        return self.latency_s if objective == "latency" else -self.tokens_per_s


def host_seconds(config: LlamaConfig, spec: HardwareSpec, requests: int) -> float:
    """The host's part of a step: every request's token id in, its float32 logits out, over the wafer's I/O."""
    return requests * (4 + 4 * config.vocab_size) / spec.ingress_bytes_per_s


@lru_cache(maxsize=512)
def best(work: Workload, spec: HardwareSpec, mesh: Extent, objective: str) -> Candidate | None:
    """The best floor plan of the strategy of `work.layers` layers per region for `objective`, or None when
    no region shape fits (the first of equals). Only the floor plans that can win are scheduled request by
    request: for latency the winner alone; for throughput those whose steady-round bound
    (decode.schedule.round_bound_seconds, never above the scheduled round) is no worse than the best round
    scheduled so far."""
    config, kv, dtype = work.config, work.kv, work.dtype
    strategy = Strategy(work.layers, config.n_layers)
    floors = list(wafer.floors(config, spec, mesh, kv, dtype, strategy))
    if not floors:
        return None
    stages = [floor.stages(config.n_layers, strategy.group) for floor in floors]
    alone = [stages_alone_cycles(spec, paper_decoding(config, dtype, f.shape.head_groups), st, kv.tokens)
             for f, st in zip(floors, stages)]
    ones = [cycles_seconds(spec, sum(a)) for a in alone]
    segs = [(a, [stage.region for stage in st]) for st, a in zip(stages, alone)]

    def step(i: int) -> float:
        return ones[i] if kv.requests == 1 else requests_round_seconds(*segs[i], kv.requests, spec.clock_hz)

    if objective == "latency":
        i = min(range(len(floors)), key=ones.__getitem__)
        return Candidate(strategy, floors[i], ones[i], step(i), kv.requests)
    bound = [round_bound_seconds(*seg, kv.requests, spec.clock_hz) for seg in segs]
    won: tuple[float, int] | None = None
    for i in sorted(range(len(floors)), key=bound.__getitem__):
        if won is not None and bound[i] > won[0] * (1 + 1e-9):
            break  # neither this floor plan nor any after it can beat the best one
        won = min(won or (step(i), i), (step(i), i))
    return Candidate(strategy, floors[won[1]], ones[won[1]], won[0], kv.requests)


def estimate(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, kv: KVReserve, dtype: str = "float16",
             objective: Objective = Objective()) -> Estimate:
    """Plan `config` on a mesh of `mesh` cores of `spec` and estimate its decode with the best
    of the strategies ``objective.tried`` for ``objective.goal`` (module doc); ``objective.advise`` False
    skips the search for what would fit when nothing does. Labelled "<n>-layer model" (name it with
    ``dataclasses.replace(e, label=...)``)."""
    goal = objective.goal
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown storage dtype {dtype!r}; use one of {', '.join(STORAGE_DTYPES)}")
    whole = spec.full_mesh
    if not (1 <= mesh.width <= whole.width and 1 <= mesh.height <= whole.height):
        raise ValueError(f"mesh {mesh} is not inside the {spec.name} wafer ({whole} cores)")
    asked = objective.tried
    found = [c for c in (best(Workload(config, kv, dtype, s.group), spec, mesh, goal)
                         for s in asked or worth_trying(config.n_layers)) if c is not None]
    base = {"label": f"{config.n_layers}-layer model", "config": config, "spec": spec, "mesh": mesh, "kv": kv,
            "dtype": dtype, "objective": goal}
    if not found:
        one = asked[0] if asked and len(asked) == 1 else None
        return Estimate(**base, strategy=one, fits=False,
                        advice=advice(config, spec, mesh, kv, dtype, asked) if objective.advise else ())
    win = min(found, key=lambda c: c.score(goal))
    if asked and len(asked) == 1:
        return _report(config, spec, win, base, f"strategy {win.strategy.kind} as asked (--strategy)")
    why = explain(win, found, goal)
    if asked:
        why += f"; tried only {' and '.join(sorted({s.kind for s in asked}))} strategies, as asked (--strategy)"
    return _report(config, spec, win, base, why)


def _report(config: LlamaConfig, spec: HardwareSpec, c: Candidate, base: dict, why: str) -> Estimate:
    floor, kv, dtype = c.floor, base["kv"], base["dtype"]
    stages = floor.stages(config.n_layers, c.strategy.group)
    used = floor.bands * floor.band_cols * floor.band_rows + c.strategy.regions * floor.shape.cores
    work = Workload(config, kv, dtype, c.strategy.group)
    layer_bytes = wafer.layer_core_bytes(work, floor.shape)
    band_bytes = wafer.budget.embed_bytes(config, floor.band_cols, floor.band_rows, dtype)
    sram = c.strategy.regions * floor.shape.cores * layer_bytes + floor.bands * floor.band_cols * floor.band_rows * \
        band_bytes
    cap = wafer.shape_kv_capacity(work, floor.shape, spec.sram_bytes)
    parts = _one_token_parts(spec, paper_decoding(config, dtype, floor.shape.head_groups), stages, kv.tokens)
    host1, host_r = host_seconds(config, spec, 1), host_seconds(config, spec, kv.requests)
    return Estimate(**base, strategy=c.strategy, fits=True, why=why, floor=floor, cores_used=used, sram_used_bytes=sram,
                    layer_core_bytes=layer_bytes, kv_tokens_per_request=cap,
                    time_per_token_s=c.latency_s + host1, step_s=c.step_s + host_r,
                    breakdown_s={**breakdown_seconds(parts, spec), "host": host1},
                    bounds_s=_bounds(parts, spec, host1))


def _bounds(parts, spec: HardwareSpec, host: float) -> dict[str, float]:
    """One request's token split by what the time is spent on: the cores computing (flops), the fabric
    moving (every message and hand-over), the wafer's ingress (host I/O)."""
    compute = cycles_seconds(spec, sum(c.cycles for _, _, c in parts if c.flops))
    fabric = cycles_seconds(spec, sum(c.cycles for _, _, c in parts if not c.flops))
    return {"compute": compute, "fabric": fabric, "ingress": host}


def _one_token_parts(spec: HardwareSpec, dec: Decoding, stages: Sequence[Stage], kv_tokens: int) -> list:
    """(name, category, Cost) of one request's token through every stage: what the breakdown sums."""
    out = []
    for s, stage in enumerate(stages):
        if s:
            out.append(("handover", "handover", stage_handover(spec, dec.config, stages[s - 1].region, stage.region,
                                                               1)))
        if stage.kind is StageKind.LAYER:
            out += layer_decode_parts(spec, dec, stage.region, kv_tokens, 1)
        elif stage.kind is StageKind.HEAD:
            out += head_decode_parts(spec, dec, stage.region, 1)
    return out
