"""What an estimate says, as one frozen value: the plan, the decode speed, its breakdown, or why it does not fit.

Contract: :class:`Estimate` holds only plain values and frozen ones; ``text()`` is what ``waferrt estimate``
prints, ``to_json()`` what ``--json`` prints (at least tokens_per_s, time_per_token_s, cores_used,
sram_used_bytes, kv_capacity_tokens and breakdown_s in seconds). ``breakdown_seconds`` sums named,
categorised Costs (``waferrt.decode.cost`` parts) into seconds per category.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from waferrt.core.mesh import Extent
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import CATEGORIES
from waferrt.model.config import LlamaConfig
from waferrt.scheduler.types import KVReserve, Strategy

from .wafer import Floor, Shape

LABELS = {"gemv": "GEMV", "allreduce": "allreduce", "attention": "attention and K/V", "elementwise": "element-wise",
          "handover": "hand-over between regions", "host": "host I/O", "alltoall": "all-to-all (MoE)"}


def breakdown_seconds(parts, spec: HardwareSpec) -> dict[str, float]:
    """Seconds per category of (name, category, Cost) parts, in CATEGORIES order."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for _, cat, c in parts:
        out[cat] += c.seconds(spec)
    return out


def gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


@dataclass(frozen=True)
class Estimate:
    label: str
    config: LlamaConfig
    spec: HardwareSpec
    mesh: Extent
    kv: KVReserve
    dtype: str
    objective: str
    strategy: Strategy | None
    fits: bool
    advice: tuple[str, ...] = ()
    why: str = ""
    floor: Floor | None = None  # the floor plan: the embedding (and untied head) bands, the layer regions' shape
    cores_used: int = 0
    sram_used_bytes: int = 0  # booked over the used cores (their most loaded core's bytes, times the cores)
    layer_core_bytes: int = 0  # the most loaded core of a layer region
    kv_tokens_per_request: int = 0  # the most K/V positions per request the regions hold, with kv.requests
    time_per_token_s: float = math.inf  # one request alone, host I/O included
    step_s: float = math.inf  # one token for each of kv.requests requests in flight
    breakdown_s: dict = field(default_factory=dict)  # one request's token, seconds per category
    bounds_s: dict = field(default_factory=dict)  # the same token: compute, fabric, ingress seconds
    streaming: object | None = None  # a streaming.Streaming when asked for

    @property
    def shape(self) -> Shape | None:
        """Every layer region's shape (None: nothing fits)."""
        return None if self.floor is None else self.floor.shape

    @property
    def tokens_per_s(self) -> float:
        return self.kv.requests / self.step_s if self.fits else 0.0

    @property
    def request_tokens_per_s(self) -> float:
        return 1.0 / self.time_per_token_s if self.fits else 0.0

    @property
    def bound(self) -> str:
        """What bounds the decode: "SRAM capacity" when it does not fit, else what one token's time goes to
        most (compute, fabric, ingress)."""
        return max(self.bounds_s, key=self.bounds_s.get) if self.fits else "SRAM capacity"

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_tokens_per_request * self.kv.requests

    def to_json(self) -> dict:
        out = {"model": self.label, "spec": self.spec.name, "mesh": list(self.mesh), "dtype": self.dtype,
               "kv_tokens": self.kv.tokens, "requests": self.kv.requests, "objective": self.objective,
               "fits": self.fits, "strategy": self.strategy.kind.value if self.strategy else None,
               "layers_per_region": self.strategy.group if self.strategy else None,
               "tokens_per_s": self.tokens_per_s, "request_tokens_per_s": self.request_tokens_per_s,
               "time_per_token_s": self.time_per_token_s if self.fits else None,
               "step_s": self.step_s if self.fits else None, "cores_used": self.cores_used,
               "sram_used_bytes": self.sram_used_bytes, "kv_capacity_tokens": self.kv_capacity_tokens,
               "kv_tokens_per_request": self.kv_tokens_per_request, "breakdown_s": dict(self.breakdown_s),
               "bounds_s": dict(self.bounds_s), "bound": self.bound,
               "why": self.why, "advice": list(self.advice)}
        if self.shape is not None:
            out["layer_region"] = {"cols": self.shape.cols, "rows": self.shape.rows,
                                   "head_groups": self.shape.head_groups, "core_bytes": self.layer_core_bytes,
                                   "regions": self.strategy.regions}
            f = self.floor
            out["bands"] = {"cols": f.band_cols, "rows": f.band_rows, "count": f.bands}
        if self.streaming is not None:
            out["streaming"] = self.streaming.to_json()
        return out

    def head(self) -> str:
        c, s = self.config, self.spec
        tied = "tied" if c.tie_embeddings else "untied"
        return (f"{self.label}: {c.n_layers} layers, dim {c.dim}, heads {c.n_heads}/{c.n_kv_heads}, hidden "
                f"{c.hidden_dim}, vocab {c.vocab_size} ({tied} head), {c.params() / 1e9:.2f} B parameters\n"
                f"on {s.name}: {self.mesh} cores of {s.sram_bytes // 1024} KB at "
                f"{s.clock_hz / 1e9:.2f} GHz; {self.dtype}; K/V {self.kv.tokens} tokens x {self.kv.requests} requests")

    def text(self) -> str:
        lines = [self.head()]
        if not self.fits:
            lines.append("DOES NOT FIT in SRAM" + (f" with strategy {self.strategy.kind}" if self.strategy else ""))
            lines += [f"  - {a}" for a in self.advice]
        else:
            lines += self._fit_lines()
        if self.streaming is not None:
            lines += ["", self.streaming.text()]
        return "\n".join(lines)

    def _fit_lines(self) -> list[str]:
        sh, f, r = self.shape, self.floor, self.kv.requests
        bc, br, bn = f.band_cols, f.band_rows, f.bands
        bands = "embedding/head band" if bn == 1 else "embedding and output-head bands"
        groups = f", rows in {sh.head_groups} head groups" if sh.head_groups > 1 else ""
        total = sum(self.breakdown_s.values())
        parts = ", ".join(f"{LABELS[k]} {v * 1e3:.4f} ms ({100 * v / total:.0f}%)"
                          for k, v in self.breakdown_s.items() if v > 0)
        all_cores = self.mesh.cores
        return [
            f"strategy        {self.strategy.describe()}: layer regions of {sh.cols}x{sh.rows} cores{groups}; "
            f"{bands} {bc}x{br}",
            f"why             {self.why}",
            f"one request     {self.time_per_token_s * 1e3:.4f} ms per token = "
            f"{self.request_tokens_per_s:,.0f} tokens/s",
            f"{f'{r} in flight':15} {self.step_s * 1e3:.4f} ms per step = {self.tokens_per_s:,.0f} tokens/s "
            f"({self.tokens_per_s / r:,.0f} per request)",
            f"breakdown       (one request's token) {parts}",
            f"cores           {self.cores_used:,} of {all_cores:,} used",
            f"SRAM            {gb(self.sram_used_bytes)} booked of {gb(all_cores * self.spec.sram_bytes)}; "
            f"a layer region's fullest core {self.layer_core_bytes / 1024:.1f} KB of "
            f"{self.spec.sram_bytes / 1024:.0f} KB",
            f"K/V capacity    {self.kv_tokens_per_request:,} tokens per request x {r} requests = "
            f"{self.kv_capacity_tokens:,} tokens",
        ]
