"""Weight streaming on paper: the weights live off-wafer (Cerebras' MemoryX) and stream in layer by layer.

Contract (pure): ``streaming(cfg, spec, mesh, kv, dtype)`` returns a :class:`Streaming` (or one whose
``fits`` is False with the reason). One region runs every layer (as the tensor strategy) and keeps what
stays on the wafer: every layer's K/V for ``kv.requests`` requests, the scratch, and a double buffer for
the weight blocks of the block being computed and the next one (the largest of a layer and the output
head). The host looks the embedding row up and sends it in. Per step the weights of every layer and the
head cross the wafer's ingress (``spec.ingress_bytes_per_s``) once for all requests in flight, while the
region computes the block before: a two-stage pipeline (stream, compute) over L + 1 blocks, scheduled by
``decode.cost.pipeline_seconds``; the compute of a block is every micro-batch's layer (or head) cost on the
region (``decode.cost``). So tokens/s is bounded by R x ingress / weight bytes (ingress-bound), until the
compute of a block outlasts its stream (the knee); ``resident`` compares the weights-in-SRAM estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from waferrt.core.arith import cdiv
from waferrt.core.dtypes import itemsize
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import head_decode_cost, lane_batches, layer_decode_cost, pipeline_seconds
from waferrt.model.config import LlamaConfig

from . import budget, wafer
from .estimate import host_seconds
from .estimate_report import gb
from .types import KVReserve


@dataclass(frozen=True)
class Streaming:
    requests: int
    fits: bool
    reason: str = ""
    shape: wafer.Shape | None = None
    core_bytes: int = 0  # the fullest core: every layer's K/V, the double buffer, scratch
    kv_tokens_per_request: int = 0
    weight_bytes: int = 0  # streamed per step: every layer and the output head
    step_s: float = 0.0  # kv.requests requests in flight, host I/O included
    time_per_token_s: float = 0.0  # one request
    ingress_bound_tokens_per_s: float = 0.0  # requests x ingress / weight bytes
    knee_requests: int = 0  # from this many requests in flight on, compute outlasts the stream
    max_requests: int = 0  # the most requests whose K/V (kv_tokens each) the region holds
    resident_tokens_per_s: float | None = None  # weights in SRAM, same requests (None: they do not fit)

    @property
    def tokens_per_s(self) -> float:
        return self.requests / self.step_s if self.fits else 0.0

    def to_json(self) -> dict:
        keys = ("fits", "reason", "core_bytes", "kv_tokens_per_request", "weight_bytes", "step_s",
                "time_per_token_s", "ingress_bound_tokens_per_s", "knee_requests", "max_requests",
                "resident_tokens_per_s")
        out = {k: getattr(self, k) for k in keys}
        out["tokens_per_s"] = self.tokens_per_s
        if self.shape is not None:
            out["region"] = {"cols": self.shape.cols, "rows": self.shape.rows,
                             "head_groups": self.shape.head_groups}
        return out

    def text(self) -> str:
        if not self.fits:
            return f"weight streaming: does not fit either: {self.reason}"
        s, r = self.shape, self.requests
        resident = ("weights resident in SRAM do not fit" if self.resident_tokens_per_s is None else
                    f"weights resident in SRAM: {self.resident_tokens_per_s:,.0f} tokens/s at {r} in flight")
        bound = "ingress-bound" if r < self.knee_requests else "compute-bound"
        room = (f"the region holds K/V for at most {self.max_requests:,} requests, so streaming stays ingress-bound "
                f"(at most {self.ingress_bound_tokens_per_s * self.max_requests / r:,.1f} tokens/s)"
                if self.max_requests < self.knee_requests else
                f"the region holds K/V for up to {self.max_requests:,} requests")
        return "\n".join([
            f"weight streaming: one {s.cols}x{s.rows} region (K/V and a double buffer of weight blocks, "
            f"{self.core_bytes / 1024:.1f} KB per core); {gb(self.weight_bytes)} of weights stream in per step",
            f"  one request   {self.time_per_token_s * 1e3:.3f} ms per token = "
            f"{1 / self.time_per_token_s:,.1f} tokens/s",
            f"  {f'{r} in flight':13} {self.step_s * 1e3:.3f} ms per step = {self.tokens_per_s:,.1f} tokens/s "
            f"({bound}; the ingress allows {self.ingress_bound_tokens_per_s:,.1f})",
            f"  crossover     compute outlasts the stream from {self.knee_requests:,} requests in flight on; {room}",
            f"  vs resident   {resident}",
        ])


def _block_bytes(cfg: LlamaConfig, shape: wafer.Shape, dtype: str) -> int:
    """Per-core bytes of the larger streamed block: one layer's weights or the output head's."""
    layer = wafer.layer_core_bytes(cfg, shape, shape.cols, 1, dtype, kv=False) - \
        wafer.layer_core_bytes(cfg, shape, shape.cols, 1, dtype, kv=False, weights=False)
    head = cdiv(cfg.vocab_size, shape.rows) * cdiv(cfg.dim, shape.cols) * itemsize(dtype)
    return max(layer, head)


def _core_bytes(cfg: LlamaConfig, shape: wafer.Shape, tokens: int, requests: int, dtype: str) -> int:
    kv_and_scratch = wafer.layer_core_bytes(cfg, shape, tokens, requests, dtype, cfg.n_layers, weights=False)
    return kv_and_scratch + 2 * _block_bytes(cfg, shape, dtype)


def _shape(cfg: LlamaConfig, spec: HardwareSpec, mesh: tuple[int, int], kv: KVReserve, dtype: str):
    """The widest, tallest region (most cores, so the shortest compute) that holds the streaming state."""
    best = None
    for rows, groups in wafer.row_options(cfg, mesh[1]):
        shape = wafer.Shape(min(mesh[0], cfg.dim, kv.tokens), rows, groups)
        if wafer.legal(cfg, shape, kv.tokens) and _core_bytes(cfg, shape, kv.tokens, kv.requests, dtype) <= \
                spec.sram_bytes and (best is None or shape.cores > best.cores):
            best = shape
    return best


def _step_seconds(cfg, spec, shape, kv: KVReserve, dtype: str, requests: int) -> tuple[float, float, float]:
    """(step seconds, stream cycles of a layer, compute cycles of a layer) with `requests` in flight."""
    region, kw = shape.region(), {"head_groups": shape.head_groups}
    batches = lane_batches(requests)
    layer_bytes = budget.work_bytes(cfg, dtype)[1]
    head_bytes = cfg.vocab_size * cfg.dim * itemsize(dtype)
    per_byte = spec.clock_hz / spec.ingress_bytes_per_s
    layer = sum(layer_decode_cost(spec, cfg, region, kv.tokens, b, **kw).cycles for b in batches)
    head = sum(head_decode_cost(spec, cfg, region, b).cycles for b in batches)
    cycles = {(0, i): layer_bytes * per_byte for i in range(cfg.n_layers)}
    cycles |= {(1, i): layer for i in range(cfg.n_layers)}
    cycles[(0, cfg.n_layers)], cycles[(1, cfg.n_layers)] = head_bytes * per_byte, head
    rows_in = requests * cfg.dim * itemsize(dtype) / spec.ingress_bytes_per_s  # the embedding rows, from the host
    seconds = pipeline_seconds(cycles, 2, cfg.n_layers + 1, spec.clock_hz)
    return seconds + rows_in + host_seconds(cfg, spec, requests), layer_bytes * per_byte, layer


def streaming(cfg: LlamaConfig, spec: HardwareSpec, mesh: tuple[int, int], kv: KVReserve, dtype: str,
              resident_tokens_per_s: float | None = None) -> Streaming:
    shape = _shape(cfg, spec, mesh, kv, dtype)
    if shape is None:
        return Streaming(kv.requests, False, reason=(
            f"every layer's K/V for {kv.requests} requests x {kv.tokens} tokens and a double buffer of weight "
            f"blocks do not fit in any region of the {mesh[0]}x{mesh[1]} mesh: lower --kv-tokens or --requests"))
    step, stream, _ = _step_seconds(cfg, spec, shape, kv, dtype, kv.requests)
    one, _, _ = _step_seconds(cfg, spec, shape, kv, dtype, 1)
    weights = cfg.n_layers * budget.work_bytes(cfg, dtype)[1] + cfg.vocab_size * cfg.dim * itemsize(dtype)
    cap = _most_tokens(cfg, spec, shape, kv, dtype)
    knee = _knee(cfg, spec, shape, kv, dtype, stream)
    most = kv.requests
    while most < 1 << 16 and _core_bytes(cfg, shape, kv.tokens, most * 2, dtype) <= spec.sram_bytes:
        most *= 2  # then bisect between most and 2 * most
    lo, hi = most, most * 2 - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _core_bytes(cfg, shape, kv.tokens, mid, dtype) <= spec.sram_bytes else (lo, mid - 1)
    return Streaming(kv.requests, True, shape=shape, core_bytes=_core_bytes(cfg, shape, kv.tokens, kv.requests, dtype),
                     kv_tokens_per_request=cap, weight_bytes=weights, step_s=step, time_per_token_s=one,
                     ingress_bound_tokens_per_s=kv.requests * spec.ingress_bytes_per_s / weights,
                     knee_requests=knee, max_requests=lo, resident_tokens_per_s=resident_tokens_per_s)


def _most_tokens(cfg, spec, shape, kv: KVReserve, dtype: str) -> int:
    lo, hi = kv.tokens, max(kv.tokens, cfg.max_seq_len)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _core_bytes(cfg, shape, mid, kv.requests, dtype) <= spec.sram_bytes else (lo, mid - 1)
    return lo


def _knee(cfg, spec, shape, kv: KVReserve, dtype: str, stream: float) -> int:
    """The fewest requests in flight (doubling, up to 2**16) whose layer compute outlasts the layer's stream."""
    r = 1
    while r < 1 << 16 and _step_seconds(cfg, spec, shape, kv, dtype, r)[2] < stream:
        r *= 2
    return r
