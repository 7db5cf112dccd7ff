"""Hardware specs (the PLMR device model) as immutable values, and the named presets.

Contract: a :class:`HardwareSpec` is a frozen, hashable description of one wafer-scale chip:
its full mesh size and topology (core.topology: the 2D mesh unless told), SRAM bytes per core, per-hop
latency (alpha), per-routing-stage cost (beta),
link bandwidth, core compute and clock, and the bandwidth into and out of the wafer (host I/O, and the
weights streamed from off-wafer memory). Nothing here knows about Ray, sockets or numpy arrays.
Every figure of a preset names its public source next to it; where none exists, the comment says what
was assumed (docs/ESTIMATES.md lists those assumptions).
``spec_by_name("tiny" | "wse2" | "wse3")`` returns a preset; ``HardwareSpec.replace(...)`` derives one.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from .mesh import Extent
from .topology import MESH, Topology


@dataclass(frozen=True)
class HardwareSpec:
    """One wafer-scale chip, in the terms of WaferLLM's PLMR model.

    P: ``full_mesh`` cores, each doing ``flops_per_cycle``.
    L: a message pays ``alpha_cycles`` per hop (non-uniform latency grows with distance).
    M: every core owns ``sram_bytes`` and nothing else.
    R: a core can run only a few routes at once; every routing stage a message passes through
       (a core that forwards or combines, not just passes it on) pays ``beta_cycles``.
    """

    name: str
    full_mesh: Extent  # (width, height) of the whole wafer, in cores; a plain (w, h) tuple is converted
    sram_bytes: int  # per core
    alpha_cycles: float  # latency of one hop between neighbouring cores
    beta_cycles: float  # fixed cost of one routing stage (software forward/reduce step)
    link_bytes_per_cycle: float  # per link, per direction
    flops_per_cycle: float  # per core, float32
    clock_hz: float
    ingress_bytes_per_s: float = 150e9  # off-wafer I/O: host <-> wafer, and weights streamed in (MemoryX)
    half_flops_per_cycle: float | None = None  # per core, float16/bfloat16 (None: the float32 rate)
    topology: Topology = MESH  # which links join the cores (core.topology): the 2D mesh unless told

    def __post_init__(self) -> None:
        object.__setattr__(self, "full_mesh", Extent(*self.full_mesh))  # the one conversion of a preset's tuple
        if self.full_mesh.width < 1 or self.full_mesh.height < 1:
            raise ValueError(f"full_mesh must be at least 1x1 cores, got {self.full_mesh}")
        for field in ("sram_bytes", "alpha_cycles", "link_bytes_per_cycle", "flops_per_cycle", "clock_hz",
                      "ingress_bytes_per_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"HardwareSpec.{field} must be positive, got {getattr(self, field)!r}")
        if self.half_flops_per_cycle is not None and self.half_flops_per_cycle <= 0:
            raise ValueError(f"HardwareSpec.half_flops_per_cycle must be positive or None, got "
                             f"{self.half_flops_per_cycle!r}")
        if not isinstance(self.topology, Topology):
            raise ValueError(f"HardwareSpec.topology must be a waferrt.core.topology.Topology, got {self.topology!r}")
        if self.beta_cycles < 0:
            raise ValueError(f"HardwareSpec.beta_cycles must be >= 0, got {self.beta_cycles!r}")

    @property
    def cores(self) -> int:
        return self.full_mesh.cores

    def flops_per_cycle_at(self, dtype: str = "float32") -> float:
        """A core's compute rate for work on `dtype` data (float16 and bfloat16 share the 16-bit rate)."""
        if dtype == "float32" or self.half_flops_per_cycle is None:
            return self.flops_per_cycle
        return self.half_flops_per_cycle

    def as_dict(self) -> dict:
        """Its fields as plain values (for JSON); the topology only when it is not the mesh, so that a mesh
        spec's form is what it was before topologies existed."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "topology"}
        if self.topology != MESH:
            d["topology"] = {"kind": self.topology.kind, "group": self.topology.group}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> HardwareSpec:
        """The spec of its ``as_dict`` form."""
        topology = Topology(**d["topology"]) if "topology" in d else MESH
        return cls(**{**d, "topology": topology})

    def on_line(self, axis: str, n: int, wafer: int | None = None) -> HardwareSpec:
        """The spec a line of n cores along `axis` ("x": a row, "y": a column) routes over: a torus's wrap links
        join the ends of the wafer's whole lines only, so a line shorter than the wafer's (`wafer` cores along
        `axis`; default ``full_mesh``'s) routes as the mesh (``Topology.on_line``). The one owner of which
        lines wrap: the fabric's lines (waferrt.fabric.comm.LineComm) and the closed forms (decode.cost) ask it."""
        return _on_line(self, n == (wafer or self.full_mesh[0 if axis == "x" else 1]))

    def replace(self, **changes) -> HardwareSpec:
        """A copy with some fields changed, e.g. ``spec.replace(sram_bytes=64 * 1024)``."""
        return dataclasses.replace(self, **changes)


@functools.lru_cache(maxsize=64)
def _on_line(spec: HardwareSpec, whole: bool) -> HardwareSpec:
    topo = spec.topology.on_line(whole)
    return spec if topo == spec.topology else spec.replace(topology=topo)


# Small and fast: what the unit tests and demos use. 16 KB per core keeps SRAM-overflow paths reachable
# with small tensors; latency figures are the WSE-2 ones so that costs stay comparable (a made-up chip:
# no source, by design).
TINY = HardwareSpec(
    name="tiny",
    full_mesh=(64, 64),
    sram_bytes=16 * 1024,
    alpha_cycles=1.0,
    beta_cycles=8.0,
    link_bytes_per_cycle=4.0,
    flops_per_cycle=2.0,
    clock_hz=1.1e9,
)

# Cerebras WSE-2, figure by figure (docs/ESTIMATES.md "Hardware figures" lists the same, and what is assumed):
# - full_mesh 750x994: the grid of cores a kernel may use on a CS-2 (Cerebras SDK: csl-examples
#   benchmarks/single-tile-matvec README, "fabric-dims must be 750,994" on a real CS-2), the one WaferLLM
#   runs on (He et al., "WaferLLM", OSDI'25, arXiv:2502.04563, sec. 7); 850,000 cores on the die (Cerebras
#   WSE-2 announcement, April 2021; AnandTech "Cerebras Unveils WSE2", 2021).
# - sram_bytes 48 KB: "each core contains 48KB of SRAM" (WaferLLM sec. 7; ServeTheHome, "Cerebras WSE-2 at
#   Hot Chips 34", 2022); 40 GB over 850,000 cores = 47 KB agrees.
# - alpha_cycles 1: a router forwards a 32-bit message to a neighbour "with a single clock cycle" (WaferLLM
#   sec. 7, experiment setup).
# - beta_cycles 30: ASSUMED, no public figure: a software routing stage (a core receives, combines and
#   re-sends) costs "tens of cycles" (WaferLLM sec. 3, PLMR "L": alpha < beta). Not fitted; with it the
#   MeshGEMV figures come out at 1.31 and 0.98 of the measured (benchmarks/fidelity.py prints the parts).
# - link_bytes_per_cycle 4: one 32-bit message per link per cycle (WaferLLM sec. 7; the Cerebras SDK moves
#   32-bit wavelets, two float16 per wavelet in its SIMD-32 fabric mode, as MeshInfra/WaferLLM's MeshGEMV does).
# - flops_per_cycle 2: one float32 multiply-accumulate per cycle, its two 32-bit operands fetched from SRAM
#   and the result written back (WaferLLM sec. 7, experiment setup).
# - half_flops_per_cycle 8: four float16 multiply-accumulates per cycle -- the WSE-1/WSE-2 core's four-wide
#   FP16 SIMD unit (The Next Platform, "Cerebras goes hyperscale with third gen waferscale
#   supercomputers", 2024-03-14). Consistent with the memory bandwidth: 4 FMACs reading two 64-bit and writing
#   one 64-bit word per cycle is 24 B/cycle x 850,000 cores x 1.1 GHz = 22 PB/s, the figure WaferLLM (sec. 1)
#   gives; and with CS-1's stencil solver reaching 0.86 PFLOPS, "about one third of peak" (Rocki et al.,
#   SC'20, arXiv:2010.03660): ~2.6 PF on ~380,000 cores is ~7 flops per core per cycle. (Cerebras' own peak
#   figures, 62.5 PF for WSE-2 and 125 PF for WSE-3, count sparsity: 62.5 PF / 850,000 / 1.1 GHz = 67 flops
#   per cycle, far above any dense rate, so they are not used.)
# - clock_hz 1.1 GHz: "a Compute Engine (CE) operating at a maximum of 1.1 GHz" (WaferLLM sec. 7; its
#   launch scripts convert cycles at 1.1 GHz).
# - ingress_bytes_per_s 150 GB/s: the CS-2 system I/O, 1.2 Tb/s over 12x100 GbE (Cerebras CS-2 data sheet;
#   ALCF "AI accelerators" SC24 tutorial, github.com/argonne-lcf/AIaccelerators-SC24-tutorial).
WSE2 = HardwareSpec(
    name="wse2",
    full_mesh=(750, 994),
    sram_bytes=48 * 1024,
    alpha_cycles=1.0,
    beta_cycles=30.0,
    link_bytes_per_cycle=4.0,
    flops_per_cycle=2.0,
    clock_hz=1.1e9,
    ingress_bytes_per_s=150e9,
    half_flops_per_cycle=8.0,
)

# Cerebras WSE-3 (announcement, March 2024; ALCF SC24 tutorial), figure by figure:
# - full_mesh 762x1176 (896,112 cores): "the CS-3, which has a fabric dimension of 762 x 1176" (Cerebras SDK
#   docs, GEMV tutorial "running on a real system", sdk.cerebras.net), about the 900,000 cores announced. The same
#   page gives a CS-2's fabric as 757 x 996, the WSE-2 grid above 750x994; ALCF's CS-3 docs use 762,1172.
# - sram_bytes 48 KB: 44 GB of on-chip SRAM over 900,000 cores (WSE-3 announcement) = 48 KB.
# - alpha, beta, link_bytes_per_cycle: as WSE-2 -- "Cerebras WSE-3 retains the same NoC configuration"
#   (WaferLLM sec. 8); beta stays the WSE-2 assumption.
# - half_flops_per_cycle 16: eight float16 multiply-accumulates per cycle, "an eight-wide FP16 SIMD math unit,
#   up from a four-wide SIMD engine" in WSE-2 (The Next Platform, 2024-03-14), which is Cerebras' "2x
#   performance" at a similar core count.
# - flops_per_cycle 4: ASSUMED, no public float32 figure: the WSE-2's float32:float16 ratio (1:4) kept.
# - clock_hz 1.1 GHz: ASSUMED, as WSE-2 (Cerebras publishes none; The Next Platform guesses ~5% more).
# - ingress_bytes_per_s 150 GB/s: the CS-3 keeps the CS-2's 1.2 Tb/s system I/O (12x100 GbE).
WSE3 = HardwareSpec(
    name="wse3",
    full_mesh=(762, 1176),
    sram_bytes=48 * 1024,
    alpha_cycles=1.0,
    beta_cycles=30.0,
    link_bytes_per_cycle=4.0,
    flops_per_cycle=4.0,
    clock_hz=1.1e9,
    ingress_bytes_per_s=150e9,
    half_flops_per_cycle=16.0,
)

PRESETS: dict[str, HardwareSpec] = {s.name: s for s in (TINY, WSE2, WSE3)}


def spec_by_name(spec: str | HardwareSpec) -> HardwareSpec:
    """Resolve a preset name (or pass a HardwareSpec through)."""
    if isinstance(spec, HardwareSpec):
        return spec
    try:
        return PRESETS[spec]
    except KeyError:
        raise ValueError(
            f"unknown hardware spec {spec!r}; presets are {sorted(PRESETS)} "
            "(or pass a waferrt.HardwareSpec)"
        ) from None
