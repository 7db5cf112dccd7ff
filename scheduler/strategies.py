"""Which parallelism strategy the emulator runs: plan each one, time it with the closed forms, pick by objective.

Contract (pure): ``choose(config, spec, kv, Objective(goal, tried), mesh_for, options) -> Choice``. For every
strategy in `tried` (default ``worth_trying``: one layer per region, groups of 2, 4, 8, 16 layers per
region, all layers in one region) it plans the model on ``mesh_for(strategy)`` (the mesh the user gave, or
each strategy's default mesh) with ``placement.plan(..., options=PlanOptions(strategy=...))``, times the placement with
``speed.placement_seconds`` -- the closed forms the tiles book, every request at its own pace: one
request's time per token (latency) and a steady round of ``kv.requests`` requests in flight (throughput)
-- and keeps the best for the objective. ``Choice.why`` says what won, the runners-up's modelled numbers
and what did not fit; ``Choice.table`` lists every candidate's numbers. A strategy that fits nowhere is
left out; when none fits, :class:`~waferrt.scheduler.types.PlanError` lists each one's reason.
``parse_strategy`` reads the command line's ``layer | tensor | grouped[:N]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .placement import plan
from .speed import placement_seconds
from .types import KVReserve, Objective, Placement, PlanError, PlanOptions, Strategy, StrategyKind

STRATEGY_HELP = ("layer (every layer its own region: a pipeline), tensor (one region runs every layer: WaferLLM's "
                 "wafer-scale tensor parallelism), grouped:N (N layers per region; grouped alone: the planner "
                 "picks N)")


def parse_strategy(text: str, n_layers: int) -> list[Strategy]:
    """The strategies `text` (``layer``, ``tensor``, ``grouped`` or ``grouped:N``) stands for, for a model of
    `n_layers` layers; ValueError naming the value otherwise."""
    word, _, n = text.partition(":")
    kind = {k.value: k for k in StrategyKind}.get(word)
    if kind is StrategyKind.LAYER and not n:
        return [Strategy(1, n_layers)]
    if kind is StrategyKind.TENSOR and not n:
        return [Strategy(n_layers, n_layers)]
    if kind is StrategyKind.GROUPED and not n:
        return [s for s in worth_trying(n_layers) if s.kind is StrategyKind.GROUPED] or [Strategy(1, n_layers)]
    if kind is StrategyKind.GROUPED and n.isdigit() and 1 <= int(n) <= n_layers:
        return [Strategy(int(n), n_layers)]
    raise ValueError(f"--strategy {text!r}: use layer, tensor, grouped or grouped:N with N from 1 to {n_layers} "
                     "(layers per region)")


@dataclass(frozen=True)
class Timed:
    """One strategy, planned and timed on the modelled wafer (the attributes explain reads)."""

    placement: Placement
    latency_s: float  # one request's token through every stage
    step_s: float  # a steady round of kv.requests requests in flight

    @property
    def strategy(self) -> Strategy:
        return self.placement.strategy

    @property
    def requests(self) -> int:
        return self.placement.kv.requests

    @property
    def tokens_per_s(self) -> float:
        return self.requests / self.step_s

    def score(self, objective: str) -> float:
        """Lower is better."""
        return self.latency_s if objective == "latency" else -self.tokens_per_s

    def row(self) -> str:
        p = self.placement
        r = p.layers[0]
        return (f"{p.strategy.describe():48} mesh {str(p.mesh.width) + 'x' + str(p.mesh.height):9} regions "
                f"{r.w}x{r.h}  {self.latency_s * 1e3:8.4f} ms/token  {self.tokens_per_s:10,.0f} tokens/s "
                f"({self.requests} in flight)")


@dataclass(frozen=True)
class Choice:
    placement: Placement
    why: str
    timed: tuple[Timed, ...]  # every strategy that fits, best first
    refused: tuple[tuple[Strategy, str], ...]  # (strategy, why it does not fit)

    def table(self) -> str:
        """Every candidate's modelled numbers, best first, then the ones that do not fit."""
        rows = [t.row() for t in self.timed]
        rows += [f"{s.describe():48} does not fit: {why}" for s, why in self.refused]
        return "\n".join(rows)


def timed(p: Placement) -> Timed:
    """Placement `p` timed on the modelled wafer (speed.placement_seconds)."""
    return Timed(p, *placement_seconds(p))


def choose(config: LlamaConfig, spec: HardwareSpec, kv: KVReserve, objective: Objective,
           mesh_for: Callable[[Strategy], MeshSpec], options: PlanOptions = PlanOptions()) -> Choice:
    """The best strategy for ``objective.goal`` among ``objective.tried`` (see the module docstring), each
    planned with `options` (its dtype, nodes, dead links); `mesh_for(strategy)` gives the mesh to plan it on
    (it may raise PlanError: that strategy does not fit)."""
    goal = objective.goal
    found, refused = [], []
    for s in objective.tried or worth_trying(config.n_layers):
        try:
            found.append(timed(plan(config, spec, mesh_for(s), kv=kv, options=replace(options, strategy=s))))
        except PlanError as e:
            refused.append((s, str(e).split(": it needs")[0].split("; ")[0]))
    if not found:
        raise PlanError("no strategy fits: " + "; ".join(f"{s.describe()}: {why}" for s, why in refused))
    found.sort(key=lambda t: t.score(goal))
    why = explain(found[0], found, goal)
    if refused:
        why += "; does not fit: " + ", ".join(s.describe() for s, _ in refused)
    return Choice(found[0].placement, why, tuple(found), tuple(refused))


def explain(best_c, others: list, objective: str) -> str:
    """Why `best_c` won for `objective` over `others` (anything with strategy, requests, latency_s,
    tokens_per_s and score: an estimate's Candidate, strategies.Timed), with the runners-up's numbers."""
    metric = "time per token of one request" if objective == "latency" else \
        f"tokens/s with {best_c.requests} requests in flight"

    def show(c) -> str:
        v = f"{c.latency_s * 1e3:.3f} ms" if objective == "latency" else f"{c.tokens_per_s:,.0f} tokens/s"
        return f"{c.strategy.describe()}: {v}"

    rest = sorted((c for c in others if c is not best_c), key=lambda c: c.score(objective))
    why = (f"objective {objective} ({metric}): best is {show(best_c)}"
           + ("; then " + "; ".join(show(c) for c in rest[:3]) if rest else "; no other strategy fits"))
    if objective == "latency" and best_c.strategy.group > 1:
        why += (". Stacking layers in one region gives every GEMV more cores and drops the hand-overs between "
                "layers; the cost is SRAM per core (every layer's blocks and K/V on the same cores)")
    elif objective == "throughput" and best_c.strategy.group < best_c.strategy.n_layers:
        why += (". Separate regions work on different micro-batches at the same time (a pipeline), so requests "
                "in flight overlap; one region running every layer takes them one after another")
    return why


def worth_trying(n_layers: int) -> list[Strategy]:
    """Pipeline, tensor and the mixes in between worth trying (2, 4, 8, ... layers per region)."""
    groups = {1, n_layers} | {g for g in (2, 4, 8, 16) if g < n_layers}
    return [Strategy(g, n_layers) for g in sorted(groups)]
