"""Hardware specs (the PLMR device model) as immutable values, and the named presets.

Contract: a :class:`HardwareSpec` is a frozen, hashable description of one wafer-scale chip:
its full mesh size, SRAM bytes per core, per-hop latency (alpha), per-routing-stage cost (beta),
link bandwidth, core compute and clock. Nothing here knows about Ray, sockets or numpy arrays.
``spec_by_name("tiny" | "wse2" | "wse3")`` returns a preset; ``HardwareSpec.replace(...)`` derives one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
    full_mesh: tuple[int, int]  # (width, height) of the whole wafer, in cores
    sram_bytes: int  # per core
    alpha_cycles: float  # latency of one hop between neighbouring cores
    beta_cycles: float  # fixed cost of one routing stage (software forward/reduce step)
    link_bytes_per_cycle: float  # per link, per direction
    flops_per_cycle: float  # per core, float32
    clock_hz: float

    def __post_init__(self) -> None:
        w, h = self.full_mesh
        if w < 1 or h < 1:
            raise ValueError(f"full_mesh must be at least 1x1 cores, got {w}x{h}")
        for field in ("sram_bytes", "alpha_cycles", "link_bytes_per_cycle", "flops_per_cycle", "clock_hz"):
            if getattr(self, field) <= 0:
                raise ValueError(f"HardwareSpec.{field} must be positive, got {getattr(self, field)!r}")
        if self.beta_cycles < 0:
            raise ValueError(f"HardwareSpec.beta_cycles must be >= 0, got {self.beta_cycles!r}")

    @property
    def cores(self) -> int:
        return self.full_mesh[0] * self.full_mesh[1]

    def replace(self, **changes) -> HardwareSpec:
        """A copy with some fields changed, e.g. ``spec.replace(sram_bytes=64 * 1024)``."""
        return dataclasses.replace(self, **changes)


# Small and fast: what the unit tests and demos use. 16 KB per core keeps SRAM-overflow paths reachable
# with small tensors; latency figures are the WSE-2 ones so that costs stay comparable.
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

# Cerebras WSE-2. Sources: Cerebras WSE-2 product brief (850,000 cores, 40 GB on-chip SRAM -> 48 KB per
# core, 220 Pb/s fabric, 32-bit fabric words: one 4-byte wavelet per link per cycle); WaferLLM (He et al.,
# OSDI'25, arXiv:2502.04563, sec. 2-3, PLMR model): a hop costs about one cycle, a software routing stage
# (receive, combine, re-send on a core) tens of cycles, a 750x994 usable core grid, ~1.1 GHz clock.
# flops_per_cycle: one fp32 FMA per core per cycle (fp16 SIMD would be 4x).
WSE2 = HardwareSpec(
    name="wse2",
    full_mesh=(750, 994),
    sram_bytes=48 * 1024,
    alpha_cycles=1.0,
    beta_cycles=30.0,
    link_bytes_per_cycle=4.0,
    flops_per_cycle=2.0,
    clock_hz=1.1e9,
)

# Cerebras WSE-3. Source: Cerebras WSE-3 announcement (March 2024): 900,000 cores, 44 GB on-chip SRAM
# (-> 48 KB per core), 21 PB/s memory bandwidth, 214 Pb/s fabric. Same fabric word and latencies as WSE-2
# (the public material gives no new per-hop figures); a 2x-wider core datapath than WSE-2.
WSE3 = HardwareSpec(
    name="wse3",
    full_mesh=(762, 1176),
    sram_bytes=48 * 1024,
    alpha_cycles=1.0,
    beta_cycles=30.0,
    link_bytes_per_cycle=4.0,
    flops_per_cycle=4.0,
    clock_hz=1.1e9,
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
