"""The prefill on paper: a prompt's tokens through every layer as MeshGEMMs on WaferLLM's grid, time to first token.

Contract (pure): ``prefill(est, tokens, side)`` times the prompt of `tokens` tokens as WaferLLM runs its
prefill: on a `side` x `side` grid of cores (default the largest square of the estimate's mesh, the whole
wafer's or ``--mesh``'s, at most dim cores a side), every layer in turn on the whole grid, while the
decode's floor plan (scheduler estimate ``est``) keeps its weights and K/V where they are. Each layer
costs what the emulated prefill books for that grid (waferrt.decode.prefill.prefill_work_parts, at the
estimate's dtype, a Decoding): the QKV
projection, the heads' causal attention (the transposed MeshGEMM for Q.K^T, MeshGEMM for P.V), the output
projection, gate/up and down as MeshGEMMs, the element-wise work. Between the decode's layout and the
grid (:func:`region_exchange`): every layer's weights from its decode region onto the grid and back, and
the prompt's K/V of every layer from the grid into its decode region (the decode's layout), each through
the region's boundary links. The prompt goes in equal chunks, each attending to the tokens before it: as
few as make a chunk's activations and the largest GEMM's weight blocks (double-buffered) fit in what the
decode leaves free of a core's SRAM. The first token then comes out of the head (one decode-head GEMV) and
the host exchange (token ids in, one row of logits out over ``spec.ingress_bytes_per_s``). :class:`Prefill`
is the result; ``end_to_end`` the time of an (input, output) pair: the prefill's first token, then the
decode's time per token. ``PUBLISHED`` is WaferLLM's measured Llama3-8B prefill (4096 tokens, 480^2-720^2
cores), which docs/ESTIMATES.md sets beside the model's. :func:`kernel_prefill` is the same closed forms on
the setup WaferLLM's published prefill kernel is timed on (one layer's weights resident on the grid, the prompt
in one piece, every layer alike; no decode beside it, no layout moves): what separates the model from the
measurement once the decode's layout is out of the way (``kernel_lines``); :func:`kernel_instructions` counts the
vector instructions that kernel's MeshGEMM loops issue a core a layer, and :func:`break_even_cycles` what each
would have to cost for the model to land at a measured rate (the model counts none: no public figure).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from waferrt.core.arith import cdiv, whole
from waferrt.core.cost import Cost, message_cycles, total
from waferrt.core.dtypes import itemsize
from waferrt.core.mesh import Extent, Region
from waferrt.core.spec import HardwareSpec
from waferrt.decode.cost import head_decode_parts
from waferrt.decode.decoding import Decoding
from waferrt.decode.prefill import prefill_work_parts
from waferrt.model.zoo import model_by_name

from .estimate import host_seconds, paper_decoding
from .estimate_report import Estimate

CATEGORIES = ("gemm", "attention", "elementwise", "layout", "host")
LABELS = {"gemm": "projections and MLP (MeshGEMM)", "attention": "attention Q.K^T and V (MeshGEMM)",
          "elementwise": "element-wise", "layout": "layouts (weights onto the grid and back, K/V to the decode)",
          "host": "host I/O"}
LLAMA3_8B = model_by_name("llama3-8b")[0]
PUBLISHED = (20_321, 27_687)  # WaferLLM (arXiv:2502.04563): Llama3-8B prefill tokens/s, 4096 tokens, 480^2-720^2 cores


def decoding(est: Estimate) -> Decoding:
    """What the decode's and the prefill's closed forms need of `est`: the model, its storage dtype (the
    cores compute at its rate and values move as it), the head groups of its layer regions."""
    return paper_decoding(est.config, est.dtype, est.shape.head_groups)


def activation_bytes(config, side: int, chunk: int, context: int, dtype: str) -> int:
    """The busiest core's prefill activations for a chunk on a side x side grid: the residual stream,
    Q/K/V, gate and up, one head's scores, each a block of the GEMM grid."""
    values = chunk * (2 * config.dim + 2 * config.kv_dim + 2 * config.hidden_dim + context)
    return cdiv(values, side * side) * itemsize(dtype)


def weight_block_bytes(config, side: int, dtype: str) -> int:
    """A core's share of the largest GEMM's weights (gate and up together) on the grid, twice: the GEMM's
    blocks and the next one's arriving."""
    largest = max(config.dim * (config.dim + 2 * config.kv_dim), config.n_heads * config.head_dim * config.dim,
                  2 * config.dim * config.hidden_dim, config.hidden_dim * config.dim)
    return 2 * cdiv(largest, side * side) * itemsize(dtype)


def region_exchange(spec: HardwareSpec, region: Region, mesh: Extent, grid: Region, nbytes: int) -> Cost:
    """`nbytes` spread evenly over `grid` moved out of `region` (or in: the same links the other way), in
    closed form: the share of the grid outside the region crosses the region's boundary links (its sides
    not on the mesh's edge), each carrying an equal part, over the grid's longest route (its side twice)."""
    both = region.intersect(grid)
    crossing = nbytes * (grid.size - (both.size if both else 0)) // grid.size
    links = (region.w * ((region.y0 > 0) + (region.y1 < mesh.height))
             + region.h * ((region.x0 > 0) + (region.x1 < mesh.width)))
    if crossing == 0 or links == 0:
        return Cost()
    per_link, hops = cdiv(crossing, links), grid.w + grid.h
    return Cost(hops=hops, stages=1, link_bytes=crossing, messages=links,
                cycles=message_cycles(spec, hops, 1, per_link))


@dataclass(frozen=True)
class Prefill:
    tokens: int
    chunks: int
    side: int  # the prefill's grid: side x side cores
    region: Extent  # a layer region's cols x rows (the decode's)
    regions: int
    seconds: float  # the prompt through every layer on the wafer, the layout moves included
    ttft_s: float  # + the first token from the head + the host exchange
    breakdown_s: dict = field(default_factory=dict)  # seconds per CATEGORIES
    core_bytes: int = 0  # the busiest core's activations for one chunk and the weight blocks under way
    time_per_token_s: float = 0.0  # the decode's, one request

    def __post_init__(self) -> None:
        whole("Prefill.tokens", self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def cores(self) -> int:
        return self.side * self.side

    def end_to_end(self, out_tokens: int) -> float:
        """Seconds for this prompt and `out_tokens` new tokens: the first from the prefill, then decode steps."""
        return self.ttft_s + (whole("output tokens", out_tokens) - 1) * self.time_per_token_s

    def to_json(self) -> dict:
        return {"prompt_tokens": self.tokens, "chunks": self.chunks, "gemm_grid": [self.side, self.side],
                "layer_region": list(self.region), "regions": self.regions, "cores": self.cores,
                "prefill_s": self.seconds, "tokens_per_s": self.tokens_per_s, "ttft_s": self.ttft_s,
                "breakdown_s": dict(self.breakdown_s), "activation_core_bytes": self.core_bytes}

    def lines(self) -> list[str]:
        t = sum(v for k, v in self.breakdown_s.items() if k != "host")
        parts = ", ".join(f"{LABELS[k]} {v * 1e3:.3f} ms ({100 * v / t:.0f}%)"
                          for k, v in self.breakdown_s.items() if v > 0 and k != "host")
        chunks = f" in {self.chunks} chunks" if self.chunks > 1 else ""
        s = self.side
        return [f"prefill         {self.tokens:,} prompt tokens{chunks}: {self.seconds * 1e3:.3f} ms = "
                f"{self.tokens_per_s:,.0f} tokens/s; time to first token {self.ttft_s * 1e3:.3f} ms",
                f"prefill cores   WaferLLM's: every layer in turn as MeshGEMMs on a {s}x{s} grid = {self.cores:,} "
                f"cores (the mesh's largest square); weights from the decode's {self.regions} layer region(s) of "
                f"{self.region} and back, the K/V into them; {self.core_bytes / 1024:.1f} KB per core beside the "
                "decode's",
                f"breakdown       (the prefill) {parts}"]


def chunk_count(est: Estimate, side: int, tokens: int) -> int:
    """The fewest chunks (a power of two) whose activations and the weight blocks under way fit in what the
    decode leaves free of a core; ValueError when even one token's do not."""
    config, free = est.config, est.spec.sram_bytes - est.layer_core_bytes
    weights = weight_block_bytes(config, side, est.dtype)
    chunks = 1
    while weights + activation_bytes(config, side, cdiv(tokens, chunks), tokens, est.dtype) > free:
        if chunks >= tokens:
            raise ValueError(f"the prefill's weight blocks ({weights:,} bytes a core on a {side}x{side} grid) do "
                             f"not fit beside the decode's {est.layer_core_bytes:,}: give a larger grid or "
                             "--mesh, or fewer --kv-tokens")
        chunks *= 2
    return chunks


def _moves(est: Estimate, grid: Region, tokens: int) -> Cost:
    """Every layer's weights from its decode region onto the grid and back, and its K/V for the prompt from
    the grid into the region (region_exchange)."""
    config, size, mesh = est.config, itemsize(est.dtype), est.mesh
    floor = est.floor
    layer_bytes = size * (config.dim * (config.dim + 2 * config.kv_dim) + config.n_heads * config.head_dim
                          * config.dim + 3 * config.dim * config.hidden_dim + 2 * config.dim)
    kv_bytes = 2 * tokens * config.kv_dim * size
    out = Cost()
    for stage in floor.stages(config.n_layers, est.strategy.group)[1:-1]:
        out = out + region_exchange(est.spec, stage.region, mesh, grid, layer_bytes).scaled(2) \
            + region_exchange(est.spec, stage.region, mesh, grid, kv_bytes)
    return out


def prefill(est: Estimate, tokens: int, side: int | None = None) -> Prefill:
    """The prompt of `tokens` tokens on a `side` x `side` grid (default the mesh's largest square; module
    doc); `est` must fit."""
    if not est.fits:
        raise ValueError("the prefill's weights are the decode's, and this model does not fit")
    whole("prompt tokens", tokens)
    config, spec = est.config, est.spec
    side = side or min(*est.mesh, config.dim)
    if not 1 <= side <= min(est.mesh):
        raise ValueError(f"a prefill grid of {side}x{side} is not inside the {est.mesh} mesh; "
                         f"give a side from 1 to {min(est.mesh)}")
    grid, chunks = Region(0, 0, side, side), chunk_count(est, side, tokens)
    chunk = cdiv(tokens, chunks)
    parts = [p for c in range(chunks)
             for p in prefill_work_parts(spec, decoding(est), grid, chunk, min(tokens, (c + 1) * chunk))]
    on_wafer = dict.fromkeys(CATEGORIES, 0.0)
    for _, cat, c in parts:
        on_wafer[cat] += config.n_layers * c.seconds(spec)
    moves = _moves(est, grid, tokens)
    on_wafer["layout"] += moves.seconds(spec)
    seconds = sum(on_wafer.values())
    head = total(c for _, _, c in head_decode_parts(spec, decoding(est), est.floor.band(0))).seconds(spec)
    on_wafer["host"] = host_seconds(config, spec, 1) + 4 * (tokens - 1) / spec.ingress_bytes_per_s  # the other ids in
    return Prefill(tokens, chunks, side, Extent(est.shape.cols, est.shape.rows), est.strategy.regions, seconds,
                   seconds + head + on_wafer["host"], on_wafer,
                   weight_block_bytes(config, side, est.dtype)
                   + activation_bytes(config, side, chunk, tokens, est.dtype), est.time_per_token_s)


def published_lines(config, pre: Prefill) -> list[str]:
    """WaferLLM's measured Llama3-8B prefill beside the model's (a 4096-token prompt of that model), with the
    term that dominates the model's time; nothing for another model or prompt."""
    if config != LLAMA3_8B or pre.tokens != 4096:
        return []
    lo, hi = PUBLISHED
    where = "within" if lo <= pre.tokens_per_s <= hi else "above" if pre.tokens_per_s > hi else "below"
    t = sum(v for k, v in pre.breakdown_s.items() if k != "host")
    top = max((k for k in pre.breakdown_s if k != "host"), key=pre.breakdown_s.get)
    return [f"vs WaferLLM     measured {lo:,}-{hi:,} tokens/s on 480^2-720^2 cores: the model's "
            f"{pre.tokens_per_s:,.0f} is {where} it ({pre.tokens_per_s / hi:.2f}x the top); {LABELS[top]} "
            f"{100 * pre.breakdown_s[top] / t:.0f}% of it, in {pre.chunks} chunk(s) (fewer when the decode leaves a "
            "core more SRAM)"]


KERNEL_SOURCE = "MeshInfra/WaferLLM Prefill/WSE-2/launch_sim.py"  # loads one layer's weights onto P x P cores, times it


def kernel_prefill(config, spec, side: int, tokens: int, dtype: str) -> dict[str, float] | None:
    """Seconds per CATEGORIES of a `tokens` prompt through every layer as WaferLLM's published prefill kernel is
    timed (KERNEL_SOURCE): one layer's weights resident on a side x side grid, the prompt in one piece, every
    layer alike -- prefill_work_parts, no layout moves, no decode beside it; None when a core cannot hold its
    share of the layer's weights and the prompt's activations."""
    size, cores = itemsize(dtype), side * side
    layer = config.dim * (config.dim + 2 * config.kv_dim) + config.n_heads * config.head_dim * config.dim \
        + 3 * config.dim * config.hidden_dim
    if cdiv(layer, cores) * size + activation_bytes(config, side, tokens, tokens, dtype) > spec.sram_bytes:
        return None
    out = dict.fromkeys(CATEGORIES, 0.0)
    for _, cat, c in prefill_work_parts(spec, paper_decoding(config, dtype, 1), Region(0, 0, side, side), tokens):
        out[cat] += config.n_layers * c.seconds(spec)
    return out


def kernel_instructions(config, side: int, tokens: int) -> int:
    """The vector instructions one core issues per layer in the MeshGEMMs of WaferLLM's published prefill kernel
    (KERNEL_SOURCE's prefill.csl): each of a GEMM's `side` steps runs Kt x Nt fmach, each over an Mt-long column
    (``matmul_compute`` / ``matmul_T_compute``: for k in Kt, @map over Nt). Its GEMMs a layer (``prefill_struct``),
    as (K, N): xq, xk, xv and h1 (dim, dim: K and V at the model's full width, no grouped heads), score (dim,
    tokens), output (tokens, dim), z1 and z2 (dim, hidden), h2 (hidden, dim)."""
    d, f, t = config.dim, config.hidden_dim, tokens
    pairs = [(d, d)] * 4 + [(d, t), (t, d), (d, f), (d, f), (f, d)]
    return side * sum(cdiv(k, side) * cdiv(n, side) for k, n in pairs)


def break_even_cycles(spec, seconds: float, rate: float, tokens: int, instructions: int) -> float:
    """The cycles each of `instructions` vector instructions would have to add to a modelled prefill of `tokens`
    tokens in `seconds` for it to run at `rate` tokens/s (negative: the model is slower already)."""
    return (tokens / rate - seconds) * spec.clock_hz / instructions


def kernel_lines(config, spec, side: int, tokens: int, dtype: str) -> list[str]:
    """WaferLLM's measured Llama3-8B prefill beside kernel_prefill on a side x side grid (nothing for another
    model or prompt): the gap that remains without the decode's layout, and what the model leaves out."""
    if config != LLAMA3_8B or tokens != 4096:
        return []
    parts = kernel_prefill(config, spec, side, tokens, dtype)
    if parts is None:
        return [f"vs its kernel   a {side}x{side} grid cannot hold one layer's weights and the prompt's activations"]
    t, hi = sum(parts.values()), PUBLISHED[1]
    top = max(parts, key=parts.get)
    out = [f"vs its kernel   WaferLLM's timed setup ({KERNEL_SOURCE}): one layer's weights resident on {side}x{side} "
           f"cores, the 4096 tokens in one piece: {tokens / t:,.0f} tokens/s = {tokens / t / hi:.2f}x the measured "
           f"top; {LABELS[top]} {100 * parts[top] / t:.0f}%"]
    if tokens / t > hi:
        out.append("why above       the model's kernels, not the decode's layout, are faster than measured: a MeshGEMM "
                   "step is its block product at four FMACs a cycle and a two-hop block move; a real core adds what no "
                   "closed form here counts (instruction issue, task switches; WaferLLM's Q.K^T also reduces each "
                   "step's scores along the row: prefill.csl matmul_T_reduce_add); no constant is fitted to the gap")
        n = kernel_instructions(config, side, tokens)
        lo_c, hi_c = (break_even_cycles(spec, t, r, tokens, config.n_layers * n) for r in (hi, PUBLISHED[0]))
        out.append(f"to land in it   the kernel's MeshGEMM loops issue {n:,} vector instructions (fmach over a "
                   f"{cdiv(tokens, side)}-token column) a core a layer; each would have to cost at least {lo_c:.1f}-"
                   f"{hi_c:.1f} cycles beyond its SIMD work, which this model counts as 0 (no public figure)")
    return out
