"""A hardware design-space sweep: which wafer design serves a model best, under a fixed silicon area.

Contract (pure): ``sweep(config, base, grid, kv, dtype, Objective(goal, tried))`` estimates the model on every
:class:`Design` of a :class:`Grid` (SRAM per core x mesh x link bandwidth x clock, the rest of the base
spec kept) with ``estimate.estimate`` (the best of the strategies `tried`; None: every one worth trying)
and returns :class:`Point` values: tokens/s for the objective (one request's for "latency",
``kv.requests`` in flight for "throughput"), what bounds it (compute, fabric, ingress, or SRAM capacity
when the model does not fit), the strategy that won, the design's silicon area and whether it is within
the budget. ``best_point`` is the fastest design within the budget.

The area model (docs/ESTIMATES.md): a core is its logic (datapath, router, its share of the wafer's
wiring) plus its SRAM. SRAM costs ``SRAM_UM2_PER_BIT``: TSMC N7's high-density 6T bit cell, 0.027 um2
(Chang et al., "A 7nm 256Mb SRAM in high-k metal-gate FinFET technology", ISSCC 2017), times the array
overhead of a real macro, 1.43 (TSMC's N3E: 31.8 Mib/mm2 from a 0.021 um2 cell, IEDM 2022 as reported by
WikiChip: 0.030 um2 per bit). The logic is what remains of a WSE-2 core: 46,225 mm2 of die over 850,000
cores (Cerebras WSE-2 announcement; AnandTech 2021) = 54,382 um2 per core, minus its 48 KB of SRAM.
The budget is one WSE-2 die. Link bandwidth and clock are taken to cost no area (a simplification).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from waferrt.core.mesh import Extent
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig
from waferrt.scheduler.types import KVReserve, Objective

from .estimate import estimate
from .estimate_report import Estimate

WSE2_DIE_MM2 = 46_225.0  # Cerebras WSE-2 die (AnandTech, "Cerebras Unveils Wafer Scale Engine Two", 2021)
WSE2_CORES = 850_000  # on that die (same source)
SRAM_UM2_PER_BIT = 0.027 * 1.43  # N7 HD bit cell x macro overhead (module docstring)
CORE_UM2 = WSE2_DIE_MM2 * 1e6 / WSE2_CORES
LOGIC_UM2 = CORE_UM2 - 48 * 1024 * 8 * SRAM_UM2_PER_BIT  # a WSE-2 core without its 48 KB of SRAM
AREA_BUDGET_MM2 = WSE2_DIE_MM2


def sram_kb(sram_bytes: int) -> int | float:
    """SRAM per core in KB as a design's label shows it: whole KB as such, else to two decimals (--sram 48.9 is
    50,073 bytes: 48.9 KB, not 48)."""
    kb = sram_bytes / 1024
    return int(kb) if kb.is_integer() else round(kb, 2)


def core_area_um2(sram_bytes: int) -> float:
    return LOGIC_UM2 + sram_bytes * 8 * SRAM_UM2_PER_BIT


@dataclass(frozen=True)
class Design:
    sram_bytes: int
    mesh: Extent
    link_bytes_per_cycle: float
    clock_hz: float

    @property
    def area_mm2(self) -> float:
        return self.mesh.cores * core_area_um2(self.sram_bytes) / 1e6

    def spec(self, base: HardwareSpec) -> HardwareSpec:
        """The base spec with this design's figures (its full mesh is the design's mesh)."""
        return base.replace(name=f"{base.name}-sweep", full_mesh=self.mesh, sram_bytes=self.sram_bytes,
                            link_bytes_per_cycle=self.link_bytes_per_cycle, clock_hz=self.clock_hz)

    def label(self) -> str:
        return (f"{sram_kb(self.sram_bytes)} KB, {self.mesh}, {self.link_bytes_per_cycle:g} B/cycle, "
                f"{self.clock_hz / 1e9:g} GHz")


@dataclass(frozen=True)
class Grid:
    sram_bytes: tuple[int, ...]
    meshes: tuple[Extent, ...]
    link_bytes_per_cycle: tuple[float, ...]
    clock_hz: tuple[float, ...]

    def designs(self) -> list[Design]:
        return [Design(s, m, b, c) for b in self.link_bytes_per_cycle for c in self.clock_hz
                for m in self.meshes for s in self.sram_bytes]


DEFAULT_GRID = Grid(sram_bytes=tuple(k * 1024 for k in (24, 32, 48, 64, 96)),
                    meshes=(Extent(530, 703), Extent(650, 862), Extent(750, 994), Extent(820, 1087)),
                    link_bytes_per_cycle=(4.0,), clock_hz=(1.1e9,))


@dataclass(frozen=True)
class Point:
    design: Design
    estimate: Estimate
    objective: str

    @property
    def tokens_per_s(self) -> float:
        e = self.estimate
        return (e.request_tokens_per_s if self.objective == "latency" else e.tokens_per_s) if e.fits else 0.0

    @property
    def within_budget(self) -> bool:
        return self.design.area_mm2 <= AREA_BUDGET_MM2

    def row(self) -> dict:
        e = self.estimate
        return {"sram_kb": sram_kb(self.design.sram_bytes), "mesh": str(self.design.mesh),
                "link_bytes_per_cycle": self.design.link_bytes_per_cycle, "clock_ghz": self.design.clock_hz / 1e9,
                "area_mm2": round(self.design.area_mm2), "within_budget": self.within_budget,
                "tokens_per_s": self.tokens_per_s, "bound": e.bound,
                "strategy": e.strategy.kind.value if e.fits else None, "group": e.strategy.group if e.fits else None}


def sweep(config: LlamaConfig, base: HardwareSpec, grid: Grid, kv: KVReserve, dtype: str,
          objective: Objective) -> list[Point]:
    asked = replace(objective, advise=False)  # a design where nothing fits needs only "no"
    return [Point(d, estimate(config, d.spec(base), d.mesh, kv, dtype, asked), objective.goal) for d in grid.designs()]


def best_point(points: list[Point]) -> Point | None:
    """The fastest design within the area budget (None when none fits within it)."""
    ok = [p for p in points if p.within_budget and p.tokens_per_s > 0]
    return max(ok, key=lambda p: p.tokens_per_s, default=None)


def table(points: list[Point], best: Point | None) -> str:
    head = f"{'SRAM':>6} {'mesh':>9} {'link':>5} {'clock':>6} {'area mm2':>9} {'tokens/s':>10}  {'bound':14} strategy"
    lines = [head]
    for p in points:
        r, mark = p.row(), (" <- best within the area budget" if p is best else "")
        over = "" if p.within_budget else " (over budget)"
        strat = f"{r['strategy']} x{r['group']}" if r["strategy"] else "-"
        lines.append(f"{r['sram_kb']:>4}KB {r['mesh']:>9} {r['link_bytes_per_cycle']:>5g} {r['clock_ghz']:>5g}G "
                     f"{r['area_mm2']:>9,} {r['tokens_per_s']:>10,.0f}  {r['bound']:14} {strat}{over}{mark}")
    return "\n".join(lines)
