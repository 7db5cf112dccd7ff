"""WATOS-style co-exploration: which wafer (dies, SRAM and compute per core, die-to-die bandwidth, topology)
trains a model fastest under each strategy, within one wafer's silicon area.

Contract (pure): ``train_sweep(job, base, grid)`` builds every :class:`TrainDesign` of a :class:`TrainGrid`
on the `base` template (its per-core latency, link, clock and off-wafer I/O kept), gives each design the cores
its area pays for, estimates the training step (``estimator.train.estimate_train``) and returns
:class:`TrainPoint` values; ``best_per_strategy`` the fastest design of each strategy.

The area model (docs/ESTIMATES.md): the budget is one WSE-2 die (``estimator.sweep.AREA_BUDGET_MM2``); a core
is its SRAM plus its logic (``estimator.sweep.core_area_um2``, WSE-2 figures), of which half is ASSUMED to be
the datapath, scaled by the 16-bit flops per cycle against the WSE-2's 8; every die edge that faces a
neighbour carries a die-to-die PHY of ``PHY_MM2_PER_TBPS`` per TB/s on each side (ASSUMED: 1 mm2 per TB/s,
the order of UCIe advanced-package PHYs). What remains of a die's share of the budget is cores, laid out as
the squarest mesh of at most that many.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from waferrt.core.template import DieLinks, WaferTemplate
from waferrt.core.topology import Topology
from waferrt.estimator.sweep import AREA_BUDGET_MM2, LOGIC_UM2, core_area_um2, sram_kb

from .train import STRATEGIES, StrategyTime, TrainJob, estimate_train

PHY_MM2_PER_TBPS = 1.0  # ASSUMED (module docstring)
WSE2_HALF_FLOPS = 8.0  # the WSE-2 core's 16-bit flops per cycle (core.spec.WSE2)


@dataclass(frozen=True)
class TrainDesign:
    dies: tuple[int, int]
    sram_bytes: int  # per core
    half_flops_per_cycle: float  # per core
    d2d_bytes_per_s: float  # per die edge
    topology: Topology

    def core_um2(self) -> float:
        datapath = LOGIC_UM2 / 2 * (self.half_flops_per_cycle / WSE2_HALF_FLOPS - 1)
        return core_area_um2(self.sram_bytes) + datapath

    def phy_mm2(self) -> float:
        """Die-to-die PHYs over the whole wafer: both sides of every edge between two dies."""
        dx, dy = self.dies
        edges = 2 * dx * dy - dx - dy
        return 2 * edges * PHY_MM2_PER_TBPS * self.d2d_bytes_per_s / 1e12

    def die_mesh(self) -> tuple[int, int]:
        """The squarest mesh of cores a die's share of the budget (after the PHYs) pays for."""
        n_dies = self.dies[0] * self.dies[1]
        cores = int((AREA_BUDGET_MM2 - self.phy_mm2()) / n_dies * 1e6 / self.core_um2())
        if cores < 1:
            raise ValueError(f"{self.label()}: the PHYs leave no area for cores; fewer dies or less d2d bandwidth")
        w = math.isqrt(cores)
        return w, cores // w

    def template(self, base: WaferTemplate) -> WaferTemplate:
        die = base.die.replace(name="design", full_mesh=self.die_mesh(), sram_bytes=self.sram_bytes,
                               half_flops_per_cycle=self.half_flops_per_cycle, topology=self.topology)
        latency = base.d2d.latency_s if base.d2d else 50e-9  # ASSUMED when the base is one die
        return WaferTemplate("design", die, self.dies, DieLinks(self.d2d_bytes_per_s, latency))

    def label(self) -> str:
        d2d = f", d2d {self.d2d_bytes_per_s / 1e12:g} TB/s" if self.dies != (1, 1) else ""
        return (f"{self.dies[0]}x{self.dies[1]} dies, {sram_kb(self.sram_bytes)} KB, "
                f"{self.half_flops_per_cycle:g} flops/cycle{d2d}, {self.topology}")


@dataclass(frozen=True)
class TrainGrid:
    dies: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 4), (8, 8))
    sram_bytes: tuple[int, ...] = (48 * 1024, 96 * 1024, 192 * 1024)
    half_flops_per_cycle: tuple[float, ...] = (8.0, 32.0)
    d2d_bytes_per_s: tuple[float, ...] = (1e12, 4e12)
    topologies: tuple[Topology, ...] = (Topology("mesh"), Topology("torus"), Topology("mesh-switch"))

    def designs(self) -> list[TrainDesign]:
        """Every combination; a one-die design only once (no die-to-die links to vary)."""
        return [TrainDesign(d, s, f, b, t) for d in self.dies for s in self.sram_bytes
                for f in self.half_flops_per_cycle for b in (self.d2d_bytes_per_s[:1] if d == (1, 1)
                                                             else self.d2d_bytes_per_s) for t in self.topologies]


@dataclass(frozen=True)
class TrainPoint:
    design: TrainDesign
    cores: int
    strategies: tuple[StrategyTime, ...]

    def tokens_per_s(self, strategy: str) -> float:
        return next(s.tokens_per_s for s in self.strategies if s.strategy == strategy)

    def row(self) -> dict:
        d = self.design
        return {"dies": f"{d.dies[0]}x{d.dies[1]}", "sram_kb": sram_kb(d.sram_bytes),
                "half_flops_per_cycle": d.half_flops_per_cycle, "d2d_tb_per_s": d.d2d_bytes_per_s / 1e12,
                "topology": str(d.topology), "cores": self.cores,
                **{s.strategy: {"tokens_per_s": s.tokens_per_s, "bound": s.breakdown.bound if s.fits else "SRAM"}
                   for s in self.strategies}}


def train_sweep(job: TrainJob, base: WaferTemplate, grid: TrainGrid) -> list[TrainPoint]:
    out = []
    for d in grid.designs():
        t = d.template(base)
        out.append(TrainPoint(d, t.cores, estimate_train(job, t).strategies))
    return out


def best_per_strategy(points: list[TrainPoint]) -> dict[str, TrainPoint | None]:
    """The design with the most tokens/s for each strategy (None: it fits on none)."""
    return {s: max((p for p in points if p.tokens_per_s(s) > 0), key=lambda p: p.tokens_per_s(s), default=None)
            for s in STRATEGIES}


def train_table(points: list[TrainPoint], best: dict[str, TrainPoint | None]) -> str:
    head = (f"{'dies':>5} {'SRAM':>6} {'flops':>5} {'d2d':>6} {'topology':>13} {'cores':>9}"
            + "".join(f"{s:>18}" for s in STRATEGIES) + "  best for")
    lines = [head]
    for p in points:
        d, r = p.design, p.row()
        cells = "".join(f"{p.tokens_per_s(s):>18,.0f}" if p.tokens_per_s(s) else f"{'no fit':>18}" for s in STRATEGIES)
        mark = ", ".join(s for s, b in best.items() if b is p)
        lines.append(f"{r['dies']:>5} {r['sram_kb']:>4}KB {d.half_flops_per_cycle:>5g} {r['d2d_tb_per_s']:>4g}TB "
                     f"{r['topology']:>13} {p.cores:>9,}{cells}  {('<- ' + mark) if mark else ''}")
    return "\n".join(lines)
