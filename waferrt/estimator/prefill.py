"""The prefill on paper: a prompt's tokens through every layer as MeshGEMMs, time to first token, end to end.

Contract (pure): ``prefill(est, tokens)`` times the prompt of `tokens` tokens on the floor plan that the
decode's estimate ``est`` (scheduler.estimate) chose -- the prefill runs on the decode's own layer regions,
so its core count is the decode's, and the K/V it leaves is where the decode reads it. Each layer costs
what the emulated prefill books (waferrt.decode.prefill.prefill_layer_parts, at the estimate's dtype, a Decoding): on
the largest square of the region, the QKV projection, the heads' causal attention (the transposed MeshGEMM
for Q.K^T, MeshGEMM for P.V), the output projection, gate/up and down as MeshGEMMs, the element-wise work,
the weights moved into the GEMM layout and back, and the K/V moved into the decode's
layout (each a move of waferrt.decode.relayout, booked per link). Between regions a chunk's activations
are handed over as the tiles hand a micro-batch over (decode.cost.stage_handover, to the region beside).
The prompt goes in equal chunks, each attending to the tokens before it: at least as many as make a chunk's
activations fit in what the decode leaves free of a core's SRAM, more when that is faster (the regions then
work on successive chunks at once); every chunk's K/V moves are priced as the last's (the most).
The first token then comes out of the head (one decode-head GEMV) and the host exchange (token ids in, one
row of logits out over ``spec.ingress_bytes_per_s``). :class:`Prefill` is the result; ``end_to_end`` the
time of an (input, output) pair: the prefill's first token, then the decode's time per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from waferrt.core.arith import cdiv, whole
from waferrt.core.cost import Cost, total
from waferrt.core.dtypes import itemsize
from waferrt.core.mesh import Region
from waferrt.decode.cost import Decoding, head_decode_parts, stage_handover
from waferrt.decode.prefill import gemm_region, prefill_moves, prefill_work_parts, weights_move

from .estimate import host_seconds
from .estimate_report import Estimate

CATEGORIES = ("gemm", "attention", "elementwise", "layout", "handover", "host")
LABELS = {"gemm": "projections and MLP (MeshGEMM)", "attention": "attention Q.K^T and V (MeshGEMM)",
          "elementwise": "element-wise", "layout": "layouts (weights in and out, Q/K/V to the heads, K/V to the decode)",
          "handover": "hand-over between regions", "host": "host I/O"}


def decoding(est: Estimate) -> Decoding:
    """What the decode's and the prefill's closed forms need of `est`: the model, its storage dtype (the
    cores compute at its rate and values move as it), the head groups of its layer regions."""
    return Decoding(est.config, est.dtype, head_groups=est.shape.head_groups)


def chunk_parts(est: Estimate, region: Region, chunk: int, context: int, moves_at: int | None = None
                ) -> list[tuple[str, str, Cost]]:
    """(name, category, Cost) of one layer on `region` for `chunk` prompt tokens attending to `context`
    tokens (themselves and those before them): the emulated prefill's own closed form
    (waferrt.decode.prefill.prefill_layer_parts, in the estimate's dtype), but the weights' moves, which a
    chunked prompt makes once (``prefill``); its K/V moves those of the chunk attending to `moves_at`
    (default `context`: ``prefill`` prices every chunk's as the last's, the most, rather than route each)."""
    dec, at = decoding(est), moves_at or context
    moves = prefill_moves(est.spec, dec, region, (at - chunk, chunk), est.dtype)
    kv = [p for p in moves if p[0] != "weights_in_out"]
    return list(prefill_work_parts(est.spec, dec, region, chunk, context)) + kv


def activation_bytes(est: Estimate, region: Region, chunk: int, context: int) -> int:
    """The busiest core's prefill activations for a chunk: the residual stream, Q/K/V, gate and up, one head's
    scores, each a block of the GEMM grid."""
    config, sq = est.config, gemm_region(region)
    values = chunk * (2 * config.dim + 2 * config.kv_dim + 2 * config.hidden_dim + context)
    return cdiv(values, sq.size) * itemsize(est.dtype)


@dataclass(frozen=True)
class Prefill:
    tokens: int
    chunks: int
    grid: tuple[int, int]  # (cols, rows) of the GEMM grid in each layer region
    region: tuple[int, int]  # (cols, rows) of a layer region (the decode's)
    regions: int
    seconds: float  # the prompt through every layer on the wafer
    ttft_s: float  # + the first token from the head + the host exchange
    breakdown_s: dict = field(default_factory=dict)  # seconds per CATEGORIES
    core_bytes: int = 0  # the busiest core's activations for one chunk
    time_per_token_s: float = 0.0  # the decode's, one request

    def __post_init__(self) -> None:
        whole("Prefill.tokens", self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def cores(self) -> int:
        return self.grid[0] * self.grid[1] * self.regions

    def end_to_end(self, out_tokens: int) -> float:
        """Seconds for this prompt and `out_tokens` new tokens: the first from the prefill, then decode steps."""
        return self.ttft_s + (whole("output tokens", out_tokens) - 1) * self.time_per_token_s

    def to_json(self) -> dict:
        return {"prompt_tokens": self.tokens, "chunks": self.chunks, "gemm_grid": list(self.grid),
                "layer_region": list(self.region), "regions": self.regions, "cores": self.cores,
                "prefill_s": self.seconds, "tokens_per_s": self.tokens_per_s, "ttft_s": self.ttft_s,
                "breakdown_s": dict(self.breakdown_s), "activation_core_bytes": self.core_bytes}

    def lines(self) -> list[str]:
        t = sum(v for k, v in self.breakdown_s.items() if k != "host")
        parts = ", ".join(f"{LABELS[k]} {v * 1e3:.3f} ms ({100 * v / t:.0f}%)"
                          for k, v in self.breakdown_s.items() if v > 0 and k != "host")
        (gc, gr), (rc, rr) = self.grid, self.region
        chunks = f" in {self.chunks} chunks" if self.chunks > 1 else ""
        return [f"prefill         {self.tokens:,} prompt tokens{chunks}: {self.seconds * 1e3:.3f} ms = "
                f"{self.tokens_per_s:,.0f} tokens/s; time to first token {self.ttft_s * 1e3:.3f} ms",
                f"prefill cores   the decode's {self.regions} layer region(s) of {rc}x{rr}, MeshGEMM on "
                f"{gc}x{gr} of each = {self.cores:,} cores; {self.core_bytes / 1024:.1f} KB of activations "
                "per core",
                f"breakdown       (the prefill) {parts}"]


def _pipeline_parts(est: Estimate, region: Region, tokens: int, chunks: int) -> list[tuple[str, str, Cost]]:
    """What one prompt cut in `chunks` chunks costs on the critical path through the regions, which work on
    successive chunks at once: every chunk through one region's layers, then the last (the longest: it
    attends to the most) through each other region; a hand-over after every region."""
    config, group, regions = est.config, est.strategy.group, est.strategy.regions
    chunk, beside = cdiv(tokens, chunks), Region(region.x1, region.y0, region.w, region.h)

    def stage(c: int) -> list:
        return (chunk_parts(est, region, chunk, min(tokens, (c + 1) * chunk), tokens) * group
                + [("handover", "handover", stage_handover(est.spec, config, region, beside, chunk))])

    parts = [p for c in range(chunks) for p in stage(c)]
    return parts + stage(chunks - 1) * (regions - 1)


def prefill(est: Estimate, tokens: int) -> Prefill:
    """The prompt of `tokens` tokens on `est`'s floor plan (module doc); `est` must fit. The prompt goes in
    as few chunks as its activations fit in, or more (powers of two, up to 256) when that is faster: more
    chunks keep more regions busy at once, smaller ones make shorter GEMMs."""
    if not est.fits:
        raise ValueError("the prefill runs on the decode's floor plan, and this model does not fit")
    whole("prompt tokens", tokens)
    config, spec, sh = est.config, est.spec, est.shape
    region = sh.region()
    free = spec.sram_bytes - est.layer_core_bytes
    least = 1
    while least < tokens and activation_bytes(est, region, cdiv(tokens, least), tokens) > free:
        least *= 2
    tries = [least * 2 ** i for i in range(9) if least * 2 ** i <= min(tokens, max(least, 256))]
    timed = [(total(c for _, _, c in _pipeline_parts(est, region, tokens, n)).cycles, n) for n in tries]
    chunks = min(timed)[1]
    weights = weights_move(spec, decoding(est), region, est.dtype)
    parts = _pipeline_parts(est, region, tokens, chunks) + [
        ("weights_in_out", "layout", weights.scaled(2 * est.strategy.group))]
    on_wafer = dict.fromkeys(CATEGORIES, 0.0)
    for _, cat, c in parts:
        on_wafer[cat] += c.seconds(spec)
    seconds = total(c for _, _, c in parts).seconds(spec)
    head = total(c for _, _, c in head_decode_parts(spec, decoding(est), Region(0, 0, *est.band[:2]))).seconds(spec)
    on_wafer["host"] = host_seconds(config, spec, 1) + 4 * (tokens - 1) / spec.ingress_bytes_per_s  # the other ids in
    sq = gemm_region(region)
    return Prefill(tokens, chunks, (sq.w, sq.h), (sh.cols, sh.rows), est.strategy.regions, seconds,
                   seconds + head + on_wafer["host"], on_wafer,
                   activation_bytes(est, region, cdiv(tokens, chunks), tokens), est.time_per_token_s)
