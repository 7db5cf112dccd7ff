"""The hardware template of a wafer: dies, each a mesh of cores, joined by die-to-die links.

Contract: a :class:`WaferTemplate` is a frozen value: `die` (a HardwareSpec whose ``full_mesh`` is ONE die's
cores, with their SRAM, compute, on-die links, topology, clock, and the wafer's off-wafer I/O), `dies` (the
grid of dies) and `d2d` (:class:`DieLinks`: bytes/s per die edge and direction, latency per crossing; None
for one die). ``template.spec`` is the whole wafer as one HardwareSpec (its full mesh the dies' meshes side
by side); a one-die template's spec is its die unchanged, so the WSE presets (``TEMPLATES["wse2"]``: the
reticles of a WSE are stitched with on-die wiring, one die in this model) give every figure they gave
before. Every figure of a preset names its source or says ASSUMED; ``SOURCES`` records each multi-die preset's
:class:`Figure` as a :class:`Source`, and ``Figure.scaled`` is a template with one figure scaled (the
sensitivity tables of estimator.train_papers). Pure: no numpy arrays, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .dtypes import check_dtype
from .spec import WSE2, WSE3, HardwareSpec
from .topology import MESH, Topology


@dataclass(frozen=True)
class DieLinks:
    """The links between neighbouring dies: `bytes_per_s` over one die edge in one direction, `latency_s`
    per crossing."""

    bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0 or not self.latency_s >= 0:
            raise ValueError(f"die-to-die links need bytes_per_s > 0 and latency_s >= 0, got "
                             f"{self.bytes_per_s!r}, {self.latency_s!r}")


@dataclass(frozen=True)
class WaferTemplate:
    name: str
    die: HardwareSpec
    dies: tuple[int, int] = (1, 1)
    d2d: DieLinks | None = None

    def __post_init__(self) -> None:
        dx, dy = self.dies
        if type(dx) is not int or type(dy) is not int or dx < 1 or dy < 1:
            raise ValueError(f"a wafer has at least 1x1 dies, got {self.dies!r}")
        if self.n_dies > 1 and self.d2d is None:
            raise ValueError(f"{self.name}: {dx}x{dy} dies need die-to-die links (d2d=DieLinks(bytes_per_s, "
                             "latency_s))")

    @property
    def n_dies(self) -> int:
        return self.dies[0] * self.dies[1]

    @property
    def mesh(self) -> tuple[int, int]:
        """The wafer's cores as one grid: the dies' meshes side by side."""
        return self.die.full_mesh[0] * self.dies[0], self.die.full_mesh[1] * self.dies[1]

    @property
    def cores(self) -> int:
        return self.die.cores * self.n_dies

    @property
    def spec(self) -> HardwareSpec:
        """The whole wafer as one HardwareSpec (one die: the die itself)."""
        if self.n_dies == 1:
            return self.die
        return self.die.replace(name=self.name, full_mesh=self.mesh)

    def sram_bytes(self) -> int:
        return self.cores * self.die.sram_bytes

    def peak_flops_per_s(self, dtype: str = "float16") -> float:
        return self.cores * self.die.flops_per_cycle_at(check_dtype(dtype)) * self.die.clock_hz

    def noc_bisection_bytes_per_s(self) -> float:
        """Bytes/s across the middle of the wafer's on-die mesh, one direction (the shorter cut; a torus's
        wrap links double it)."""
        w, h = self.mesh
        wrap = 2 if self.die.topology.kind == "torus" else 1
        return wrap * min(w, h) * self.die.link_bytes_per_cycle * self.die.clock_hz

    def d2d_bisection_bytes_per_s(self) -> float:
        """Bytes/s of die-to-die links across the middle of the wafer, one direction (the shorter cut);
        infinite for one die (nothing crosses a die edge)."""
        if self.d2d is None or self.n_dies == 1:
            return float("inf")
        dx, dy = self.dies
        across = min(dy if dx > 1 else float("inf"), dx if dy > 1 else float("inf"))
        return across * self.d2d.bytes_per_s

    def replace(self, **changes) -> WaferTemplate:
        import dataclasses

        return dataclasses.replace(self, **changes)

    def with_topology(self, topology: Topology) -> WaferTemplate:
        return self.replace(die=self.die.replace(topology=topology))

    def label(self) -> str:
        d2d = f", d2d {self.d2d.bytes_per_s / 1e12:g} TB/s/edge" if self.d2d and self.n_dies > 1 else ""
        return (f"{self.name}: {self.dies[0]}x{self.dies[1]} dies of {self.die.full_mesh[0]}x{self.die.full_mesh[1]} "
                f"cores, {self.die.sram_bytes // 1024} KB each{d2d}, {self.die.topology}")


# Tesla Dojo training tile (Tesla AI Day 2021, D1 and training-tile slides; Hot Chips 34, 2022: Talpes et al.,
# "DOJO: The Microarchitecture of Tesla's Exa-Scale Computer", and Chang et al., "DOJO: Super-Compute System
# Scaling for ML Training"), figure by figure:
# - dies 5x5: "25 D1 compute dies" per training tile (AI Day 2021; Hot Chips 34 system talk).
# - die mesh 18x20: ASSUMED grid (no published floor plan) for the D1's 354 training nodes (AI Day 2021): 360
#   places, 6 of them spare. A cut through its 20 rows carries 20 x 512 GB/s = 10.24 TB/s, the D1's published
#   "10 TBps/dir" on-chip bandwidth (the shorter cut, through 18 columns, carries 9.2 TB/s).
# - sram_bytes 1.25 MB per node ("1.25MB SRAM" per training node, AI Day 2021; 11 GB per tile, Hot Chips 34).
# - half_flops_per_cycle 512: 1,024 GFLOPS BF16/CFP8 per node at 2 GHz; flops_per_cycle 32: 64 GFLOPS FP32
#   per node (AI Day 2021). 354 nodes x 1,024 GFLOPS = the D1's 362 TFLOPS. clock_hz 2 GHz (AI Day 2021).
# - link_bytes_per_cycle 256: "512 GB/s" per node in each direction (AI Day 2021) at 2 GHz.
# - d2d 2 TB/s per die edge and direction: the tile's "10 TB/s on-tile bisection bandwidth" (Hot Chips 34
#   system talk) over the 5 die edges that cross the tile's middle; the D1's "4 TBps/edge" off-chip bandwidth
#   (AI Day 2021) is this counted both ways. Latency 100 ns per crossing: ASSUMED (no published D2D latency).
# - ingress 4 TB/s: the tile's 5 Dojo Interface Processors (Hot Chips 34 system talk: "DIP x5" per tile),
#   each 32 GB of HBM at "800 GB/s" (its 900 GB/s TTP link is not the bound): the rate weights stream in.
# - alpha 1, beta 30 cycles: ASSUMED, the WSE-2's (spec.py); Tesla publishes no per-hop figure.
DOJO_D1 = HardwareSpec(name="dojo-d1", full_mesh=(18, 20), sram_bytes=1_250_000, alpha_cycles=1.0, beta_cycles=30.0,
                       link_bytes_per_cycle=256.0, flops_per_cycle=32.0, clock_hz=2.0e9, ingress_bytes_per_s=4e12,
                       half_flops_per_cycle=512.0)

# WATOS (Wang et al., "WATOS: Efficient LLM Training Strategies and Architecture Co-exploration for Wafer-scale
# Chip", HPCA 2026, arXiv:2512.12279) defines a template of dies joined by D2D links and trades compute, memory
# and D2D bandwidth for area; its structure is this class. Every figure of this design point is ASSUMED: the
# stored copies of the paper (arxiv.org/html/2512.12279v1 and its abstract pages) end before its evaluation
# setup, and no summary of that setup was found. Assumed: 6x8 dies of 96x96 cores, 96 KB SRAM and 16 float16
# flops/cycle per core, 1 GHz, 2 TB/s per die edge, 50 ns per crossing, on-die NoC and off-wafer I/O as the WSE-2's.
WATOS_DIE = WSE2.replace(name="watos-die", full_mesh=(96, 96), sram_bytes=96 * 1024, half_flops_per_cycle=16.0,
                         flops_per_cycle=4.0, clock_hz=1.0e9)
# TEMP (Wang et al., "TEMP: A Memory Efficient Physical-aware Tensor Partition-Mapping Framework on Wafer-scale
# Chips", HPCA 2026, arXiv:2512.14256): a 2D mesh of dies, tensors streamed between neighbouring dies. Its
# evaluated wafer (Table I, sec. VII-A), read SECONDHAND -- the stored copies of the paper end before its
# evaluation, so these come from third-party summaries of the paper, not its table:
# - dies 6x8: 48 dies in a 6x8 2D mesh on a 215 x 215 mm wafer.
# - d2d 4 TB/s per die edge (to each adjacent die only); 200 ns per crossing (Table I's D2D latency).
# - the die: ASSUMED, 64x64 cores of 48 KB SRAM and 32 float16 flops/cycle, 1 GHz, the WSE-2's on-die NoC and
#   off-wafer I/O. The summaries give each die ~1,800 TFLOPS, 80 MB of SRAM and 72 GB of HBM at ~1 TB/s; this
#   model has no per-die DRAM tier, so those are not taken over.
TEMP_DIE = WSE2.replace(name="temp-die", full_mesh=(64, 64), sram_bytes=48 * 1024, half_flops_per_cycle=32.0,
                        flops_per_cycle=8.0, clock_hz=1.0e9)

TEMPLATES: dict[str, WaferTemplate] = {t.name: t for t in (
    WaferTemplate("wse2", WSE2),
    WaferTemplate("wse3", WSE3),
    WaferTemplate("dojo", DOJO_D1, (5, 5), DieLinks(2e12, 100e-9)),
    WaferTemplate("watos", WATOS_DIE, (6, 8), DieLinks(2e12, 50e-9)),
    WaferTemplate("temp", TEMP_DIE, (6, 8), DieLinks(4e12, 200e-9)),
)}


class Source(Enum):
    """Where a preset's figure comes from (the comments above cite each)."""

    PUBLISHED = "published"
    SECONDHAND = "secondhand"  # third-party summaries of the paper, its table not read first-hand
    ASSUMED = "assumed"


class Figure(Enum):
    """A figure of a multi-die template that a sensitivity table scales (its value: how the table names it)."""

    DIES = "dies (rows of dies)"
    D2D_BANDWIDTH = "die-to-die TB/s per edge"
    D2D_LATENCY = "die-to-die latency"
    DIE_CORES = "cores per die"
    SRAM = "SRAM per core"
    FLOPS = "16-bit flops per cycle"
    LINK = "on-die link bytes per cycle"
    CLOCK = "clock"

    def shown(self, t: WaferTemplate) -> str:
        """This figure's value on `t`, as the tables print it."""
        die = t.die
        return {Figure.DIES: f"{t.dies[0]}x{t.dies[1]}", Figure.D2D_BANDWIDTH: f"{t.d2d.bytes_per_s / 1e12:g}",
                Figure.D2D_LATENCY: f"{t.d2d.latency_s * 1e9:g} ns",
                Figure.DIE_CORES: f"{die.full_mesh[0]}x{die.full_mesh[1]}", Figure.SRAM: f"{die.sram_bytes // 1024} KB",
                Figure.FLOPS: f"{die.half_flops_per_cycle:g}", Figure.LINK: f"{die.link_bytes_per_cycle:g}",
                Figure.CLOCK: f"{die.clock_hz / 1e9:g} GHz"}[self]

    def scaled(self, t: WaferTemplate, k: float) -> WaferTemplate:
        """`t` with this figure times k (the dies: k times the rows of dies; the cores per die: k times the cores,
        the die kept square-ish)."""
        die, d2d = t.die, t.d2d
        if self is Figure.DIES:
            return t.replace(dies=(t.dies[0], max(1, round(t.dies[1] * k))))
        if self is Figure.D2D_BANDWIDTH:
            return t.replace(d2d=DieLinks(d2d.bytes_per_s * k, d2d.latency_s))
        if self is Figure.D2D_LATENCY:
            return t.replace(d2d=DieLinks(d2d.bytes_per_s, d2d.latency_s * k))
        side = math.sqrt(k)
        return t.replace(die=die.replace(**{
            Figure.DIE_CORES: {"full_mesh": (round(die.full_mesh[0] * side), round(die.full_mesh[1] * side))},
            Figure.SRAM: {"sram_bytes": int(die.sram_bytes * k)},
            Figure.FLOPS: {"half_flops_per_cycle": die.half_flops_per_cycle * k,
                           "flops_per_cycle": die.flops_per_cycle * k},
            Figure.LINK: {"link_bytes_per_cycle": die.link_bytes_per_cycle * k},
            Figure.CLOCK: {"clock_hz": die.clock_hz * k}}[self]))


_P, _S, _A = Source.PUBLISHED, Source.SECONDHAND, Source.ASSUMED
# Where each figure of the multi-die presets comes from (the comments at each preset cite the sources).
SOURCES: dict[str, dict[Figure, Source]] = {
    "dojo": {Figure.DIES: _P, Figure.D2D_BANDWIDTH: _P, Figure.D2D_LATENCY: _A, Figure.DIE_CORES: _A,
             Figure.SRAM: _P, Figure.FLOPS: _P, Figure.LINK: _P, Figure.CLOCK: _P},
    "watos": dict.fromkeys(Figure, _A),
    "temp": {**dict.fromkeys(Figure, _A), Figure.DIES: _S, Figure.D2D_BANDWIDTH: _S, Figure.D2D_LATENCY: _S},
}


def template_by_name(name: str | WaferTemplate, topology: Topology = MESH) -> WaferTemplate:
    """A preset template (its dies' topology replaced when `topology` is not the mesh)."""
    if isinstance(name, WaferTemplate):
        return name if topology == MESH else name.with_topology(topology)
    try:
        t = TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown wafer template {name!r}; presets are {', '.join(TEMPLATES)}") from None
    return t if topology == MESH else t.with_topology(topology)
