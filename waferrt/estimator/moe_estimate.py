"""A mixture of experts on a whole wafer, on paper: its experts per region, its all-to-all, what fits.

Contract: :func:`moe_estimate(est)` takes an :class:`~estimator.estimate_report.Estimate` of an MoE model
(``est.config.moe``) and returns an :class:`MoEEstimate`: the experts' share of the weights and the
parameters a token uses; when the model fits, for each expert mapping (waferrt.decode.moe_layout) the grid
of expert blocks in a layer region and the all-to-all of a token (dispatch + combine, the routes the tiles
book: waferrt.decode.linkload.AllToAll) -- its time per token over every layer, its share of a token's time,
the hottest link and the share of cold links -- averaged over ``SAMPLE`` tokens routed uniformly at random
(seeded: a trained router's skew is not modelled); when it does not fit, the fewest wafers that hold it with
the experts split among them (expert parallelism across wafers: attention and K/V on every wafer), each wafer
judged by the estimator's own floor-plan test (``advice.fits`` of the model with E/n experts per layer; 0: no
split fits). The weight bytes are ``advice.model_bytes``' (the estimate's own figure), the experts' their
``budget.tensor_bytes``.
``text()`` is what ``waferrt estimate`` prints after the estimate, ``to_json()`` its ``"moe"`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from waferrt.core.cost import alltoall_cost, cycles_seconds
from waferrt.core.mesh import Extent, Region
from waferrt.decode.linkload import AllToAll, LinkLoad
from waferrt.decode.moe_layout import MAPPINGS, expert_blocks, expert_grid
from waferrt.decode.routed_cost import uniform_routing
from waferrt.scheduler.budget import tensor_bytes

from .advice import fits, model_bytes
from .estimate_report import Estimate

SAMPLE = 64  # tokens routed at random to average the all-to-all over


@dataclass(frozen=True)
class MappingFigures:
    grid: tuple[int, int, int]  # blocks across, down, experts per block
    block: Extent  # the largest block's cols x rows
    alltoall_s: float  # a token's dispatch + combine over every layer
    share: float  # of a token's time
    hottest_bytes: float  # a layer's hottest link, per token
    cold_share: float  # of a layer region's links, over the sample


@dataclass(frozen=True)
class MoEEstimate:
    label: str
    experts: tuple[int, int, int, int]  # n_experts, top_k, expert width, shared width
    expert_bytes: float
    weight_bytes: float
    active_params: int
    params: int
    mappings: dict = field(default_factory=dict)  # mapping -> MappingFigures (when it fits)
    wafers: int = 0  # when it does not fit: the fewest wafers holding it, the experts split (0: fits, or none)

    def text(self) -> str:
        e, k, h, s = self.experts
        shared = f", a shared expert of {s}" if s else ""
        lines = [f"experts         {e} per layer of width {h}, top-{k}{shared}: {self.expert_bytes / 1e9:,.2f} GB of "
                 f"{self.weight_bytes / 1e9:,.2f} GB of weights; a token uses {self.active_params / 1e9:.2f} B of "
                 f"{self.params / 1e9:.2f} B parameters"]
        for name, m in self.mappings.items():
            gx, gy, per = m.grid
            lines.append(f"{'mapping ' + name:15} {gx}x{gy} blocks of {m.block} cores, {per} expert(s) "
                         f"each; all-to-all {m.alltoall_s * 1e6:,.2f} us per token ({m.share:.1%} of a token's time), "
                         f"hottest link {m.hottest_bytes:,.0f} B per token, {m.cold_share:.0%} of links cold")
        if self.wafers == 0 and not self.mappings:
            lines.append("what would fit  no split of the experts over wafers: even one expert of every layer on a "
                         "wafer (with the attention, K/V and embeddings) does not fit")
        if self.wafers:
            lines.append(f"what would fit  {self.wafers} wafers with the experts split among them ({e / self.wafers:g} "
                         f"experts of every layer on each; attention, K/V and embeddings on every one; expert "
                         "parallelism across wafers is not modelled further)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        e, k, h, s = self.experts
        return {"n_experts": e, "top_k": k, "expert_width": h, "shared_width": s, "expert_bytes": self.expert_bytes,
                "weight_bytes": self.weight_bytes, "active_params": self.active_params, "wafers": self.wafers,
                "mappings": {n: vars(m) for n, m in self.mappings.items()}}


def moe_estimate(est: Estimate) -> MoEEstimate:
    """The MoE figures of an estimate (see the module docstring)."""
    config = est.config
    weights, _ = model_bytes(config, est.kv, est.dtype)
    experts = config.n_layers * tensor_bytes(config, est.dtype)["experts"]
    active = config.params() - config.n_layers * (config.layer_params() - config.layer_params(active=True))
    shape = (config.n_experts, config.top_k, config.hidden_dim, config.shared_hidden_dim)
    out = MoEEstimate(est.label, shape, experts, weights, active, config.params())
    if not est.fits:
        return MoEEstimate(**{**vars(out), "wafers": _wafers(est)})
    region = est.shape.region()
    base = est.time_per_token_s - est.breakdown_s.get("alltoall", 0.0)  # the token's time without its all-to-all
    chosen = uniform_routing(config, SAMPLE)
    return MoEEstimate(**{**vars(out), "mappings": {m: _mapping(est, region, m, chosen, base) for m in MAPPINGS}})


def _wafers(est: Estimate) -> int:
    """The fewest wafers (a divisor n > 1 of the experts) of which each holds the model with E/n experts per
    layer, by the estimator's floor-plan test; 0: not even one expert per layer per wafer fits."""
    config, e = est.config, est.config.n_experts
    for n in (n for n in range(2, e + 1) if e % n == 0):
        share = replace(config, n_experts=e // n, top_k=min(config.top_k, e // n))
        if fits(share, est.spec, est.mesh, est.kv, est.dtype, None):
            return n
    return 0


def _mapping(est: Estimate, region: Region, mapping: str, chosen: np.ndarray, base: float) -> MappingFigures:
    config, spec = est.config, est.spec
    g = expert_grid(config.n_experts, region, mapping)
    blocks = expert_blocks(config.n_experts, region, mapping)
    routes, whole = AllToAll(config.dim, region, blocks), LinkLoad(region)
    cycles = 0.0
    for token in chosen:
        for load in routes.loads(token[None]):
            cycles += alltoall_cost(spec, load).cycles
            whole.add(load)
    seconds = cycles_seconds(spec, config.n_layers * cycles / len(chosen))
    big = max(blocks, key=lambda b: b.size)
    return MappingFigures((g.gx, g.gy, g.per_block), Extent(big.w, big.h), seconds, seconds / (base + seconds),
                          whole.hottest() / len(chosen), whole.cold_share())
