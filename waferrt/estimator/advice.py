"""What would make a model fit, when the estimate finds no region shape that holds it.

Contract (pure): ``advice(config, spec, mesh, kv, dtype, tried)`` returns sentences, most useful first: the
bytes needed against the SRAM there is, the most K/V tokens (or requests) that would fit, a smaller
storage dtype, how many wafers' SRAM it needs, and weight streaming. Feasibility is the estimator's own
test (some floor plan exists for one of the strategies `tried`, None: every strategy worth trying), so
every number it names is one the estimator would accept.
"""

from __future__ import annotations

from collections.abc import Sequence

from waferrt.core.arith import cdiv, last_true
from waferrt.core.dtypes import itemsize
from waferrt.core.mesh import Extent
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig
from waferrt.scheduler import budget
from waferrt.scheduler.strategies import worth_trying
from waferrt.scheduler.types import KVReserve, Strategy

from .estimate_report import gb
from .wafer import floors


def fits(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, kv: KVReserve, dtype: str,
         tried: Sequence[Strategy] | None) -> bool:
    """Does some floor plan of one of the strategies `tried` (None: every one worth trying) hold the model: the
    owner of "fits" for every answer that names what would (advice here, estimator.moe_estimate's wafers)."""
    return any(next(floors(config, spec, mesh, kv, dtype, s), None) is not None
               for s in tried or worth_trying(config.n_layers))


def _most(hi: int, ok) -> int:
    """The largest v in [1, hi] with ok(v), or 0: halving from hi down to the first v that is ok, then a
    bisection above it. (ok is not monotone at the bottom: a region has at most kv-tokens columns, so very
    few K/V tokens can fail where more fit.)"""
    lo = hi
    while lo >= 1 and not ok(lo):
        lo //= 2
    if lo < 1:
        return 0
    return last_true(lo, min(hi, 2 * lo - 1), ok)


def most_tokens(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, requests: int, dtype: str,
                hi: int) -> int:
    """The most K/V positions per request (up to hi; 0: none) with which some floor plan of some strategy
    holds `requests` requests: the estimator's own feasibility test."""
    return _most(hi, lambda t: fits(config, spec, mesh, KVReserve(t, requests), dtype, None))


def model_bytes(config: LlamaConfig, kv: KVReserve, dtype: str) -> tuple[int, int]:
    """(weights, K/V) bytes of the whole model, the untied output head included."""
    return budget.model_bytes(config, kv.tokens, kv.requests, dtype)


def advice(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, kv: KVReserve, dtype: str,
           tried: Sequence[Strategy] | None) -> tuple[str, ...]:
    weights, kv_bytes = model_bytes(config, kv, dtype)
    have = mesh.cores * spec.sram_bytes
    out = [f"it needs at least {gb(weights + kv_bytes)} (weights {gb(weights)} + K/V {gb(kv_bytes)}, before "
           f"scratch and the cores lost to region shapes); the {mesh} mesh holds {gb(have)}"]
    tokens = _most(kv.tokens - 1, lambda t: fits(config, spec, mesh, KVReserve(t, kv.requests), dtype, tried))
    if tokens:
        out.append(f"fewer K/V tokens: --kv-tokens {tokens} fits ({kv.requests} requests)")
    reqs = _most(kv.requests - 1, lambda r: fits(config, spec, mesh, KVReserve(kv.tokens, r), dtype, tried))
    if reqs:
        out.append(f"fewer requests in flight: --requests {reqs} fits ({kv.tokens} K/V tokens each)")
    if itemsize(dtype) > 2 and fits(config, spec, mesh, kv, "bfloat16", tried):
        out.append("a 16-bit dtype: --dtype float16 or bfloat16 fits")
    full = spec.cores * spec.sram_bytes
    if mesh != spec.full_mesh and fits(config, spec, spec.full_mesh, kv, dtype, tried):
        out.append(f"more cores: the whole {spec.name} wafer ({spec.full_mesh}) fits")
    else:
        out.append(f"more wafers: its weights and K/V alone fill {cdiv(weights + kv_bytes, full)} {spec.name} "
                   "wafers' SRAM (this estimate covers one wafer; a split over wafers is not modelled)")
    if tried is not None and fits(config, spec, mesh, kv, dtype, None):
        out.append("another strategy: leave out --strategy and the planner picks one that fits")
    out.append("weight streaming: --streaming keeps only K/V and activations on the wafer and streams the "
               f"weights in over {spec.ingress_bytes_per_s / 1e9:,.0f} GB/s")
    return tuple(out)
