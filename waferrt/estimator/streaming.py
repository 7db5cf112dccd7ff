"""Weight streaming on paper: the weights live off-wafer (Cerebras' MemoryX) and stream in layer by layer.

Contract (pure): ``streaming(config, spec, mesh, kv, dtype)`` returns a :class:`Streaming` (or one whose
``fits`` is False with the reason) on the cores of ``mesh`` (a core.mesh.Extent, width x height). One region
runs every layer (as the tensor strategy) and keeps what stays on the wafer: every layer's K/V for
``kv.requests`` requests, the scratch, and a double buffer for the weight blocks of the block being computed
and the next one (the largest of a layer and the output head; decode.layout.stream_block_bytes, what the
tiles book). The host looks the embedding rows up and they stream in. A step is the tiles' own model of it
(decode.streaming.stream_step_cycles): every micro-batch of the requests in flight passes every stage on the
region, each stage lasting the longer of its compute and its block's stream over the wafer's ingress
(``spec.ingress_bytes_per_s``). So tokens/s is bounded by R x ingress / bytes streamed per step
(ingress-bound), until the compute of a layer outlasts its stream (the knee); ``resident`` compares the
weights-in-SRAM estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from waferrt.core.arith import last_true
from waferrt.core.cost import cycles_seconds
from waferrt.core.mesh import Extent
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import lane_batches, layer_decode_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.layout import stream_core_bytes
from waferrt.decode.stage import StageKind
from waferrt.decode.streaming import stream_cycles, stream_step_cycles, streamed_bytes
from waferrt.model.config import LlamaConfig
from waferrt.scheduler.types import KVReserve

from . import wafer
from .estimate import host_seconds, paper_decoding
from .estimate_report import gb


@dataclass(frozen=True)
class Streaming:
    requests: int
    fits: bool
    reason: str = ""
    shape: wafer.Shape | None = None
    core_bytes: int = 0  # the fullest core: every layer's K/V, the double buffer, scratch
    kv_tokens_per_request: int = 0
    weight_bytes: int = 0  # streamed per micro-batch's pass: every layer and the output head
    step_s: float = 0.0  # kv.requests requests in flight, host I/O included
    time_per_token_s: float = 0.0  # one request
    ingress_bound_tokens_per_s: float = 0.0  # requests x ingress / bytes streamed per step
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
            f"{self.core_bytes / 1024:.1f} KB per core); {gb(self.weight_bytes)} of weights stream in per micro-batch "
            "(each streams every block, as the tiles do)",
            f"  one request   {self.time_per_token_s * 1e3:.3f} ms per token = "
            f"{1 / self.time_per_token_s:,.1f} tokens/s",
            f"  {f'{r} in flight':13} {self.step_s * 1e3:.3f} ms per step = {self.tokens_per_s:,.1f} tokens/s "
            f"({bound}; the ingress allows {self.ingress_bound_tokens_per_s:,.1f})",
            f"  crossover     compute outlasts the stream from {self.knee_requests:,} requests in flight on; {room}",
            f"  vs resident   {resident}",
        ])


def _core_bytes(config: LlamaConfig, shape: wafer.Shape, tokens: int, requests: int, dtype: str) -> int:
    """The fullest core of a streaming region (decode.layout.stream_core_bytes, per head group)."""
    return stream_core_bytes(config, shape.region(), tokens, requests, dtype, shape.head_groups)


def _shape(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, kv: KVReserve, dtype: str):
    """The widest, tallest region (most cores, so the shortest compute) that holds the streaming state."""
    best = None
    for rows, groups in wafer.row_options(config, mesh.height):
        shape = wafer.Shape(min(mesh.width, config.dim, kv.tokens), rows, groups)
        if wafer.legal(config, shape, kv.tokens) and _core_bytes(config, shape, kv.tokens, kv.requests, dtype) <= \
                spec.sram_bytes and (best is None or shape.cores > best.cores):
            best = shape
    return best


def _step_seconds(spec: HardwareSpec, dec: Decoding, shape: wafer.Shape, kv_tokens: int, requests: int) -> float:
    """A step with `requests` in flight: their micro-batches (decode.cost.lane_batches) take turns on the region,
    each through every stage (decode.streaming.stream_step_cycles, what the tiles book), host I/O added."""
    cycles = sum(stream_step_cycles(spec, dec, shape.region(), kv_tokens, b) for b in lane_batches(requests))
    return cycles_seconds(spec, cycles) + host_seconds(dec.config, spec, requests)


def _pass_bytes(config: LlamaConfig, dtype: str, batch: int) -> int:
    """Bytes a micro-batch's pass through the region streams in: every layer, the head, its embedding rows."""
    kinds = (StageKind.LAYER,) * config.n_layers + (StageKind.HEAD, StageKind.EMBED)
    return sum(streamed_bytes(config, kind, dtype, batch) for kind in kinds)


def streaming(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, kv: KVReserve, dtype: str,
              resident_tokens_per_s: float | None = None) -> Streaming:
    shape = _shape(config, spec, mesh, kv, dtype)
    if shape is None:
        return Streaming(kv.requests, False, reason=(
            f"every layer's K/V for {kv.requests} requests x {kv.tokens} tokens and a double buffer of weight "
            f"blocks do not fit in any region of the {mesh} mesh: lower --kv-tokens or --requests"))
    dec = paper_decoding(config, dtype, shape.head_groups)

    def fits(tokens: int, requests: int) -> bool:
        return _core_bytes(config, shape, tokens, requests, dtype) <= spec.sram_bytes

    step_bytes = sum(_pass_bytes(config, dtype, b) for b in lane_batches(kv.requests))
    core_bytes = _core_bytes(config, shape, kv.tokens, kv.requests, dtype)
    return Streaming(kv.requests, True, shape=shape, core_bytes=core_bytes,
                     kv_tokens_per_request=last_true(kv.tokens, max(kv.tokens, config.max_seq_len),
                                                     lambda t: fits(t, kv.requests)),
                     weight_bytes=_pass_bytes(config, dtype, 0),
                     step_s=_step_seconds(spec, dec, shape, kv.tokens, kv.requests),
                     time_per_token_s=_step_seconds(spec, dec, shape, kv.tokens, 1),
                     ingress_bound_tokens_per_s=kv.requests * spec.ingress_bytes_per_s / step_bytes,
                     knee_requests=_knee(spec, dec, shape, kv.tokens),
                     max_requests=last_true(kv.requests, 1 << 17, lambda r: fits(kv.tokens, r)),
                     resident_tokens_per_s=resident_tokens_per_s)


def _knee(spec: HardwareSpec, dec: Decoding, shape: wafer.Shape, kv_tokens: int) -> int:
    """The fewest requests in flight (doubling, up to 2**16) whose micro-batch's layer compute outlasts the
    layer's stream."""
    stream = stream_cycles(spec, streamed_bytes(dec.config, StageKind.LAYER, dec.dtype, 1))
    r = 1
    while r < 1 << 16 and layer_decode_cost(spec, dec, shape.region(), kv_tokens, max(lane_batches(r))).cycles < stream:
        r *= 2
    return r
