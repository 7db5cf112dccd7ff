"""The prefill on the emulated wafer: a whole prompt through a layer as mesh GEMMs, leaving its K/V for the decode.

Contract: :func:`prefill_layer` runs a request's whole prompt (positions 0..T-1, T <= PREFILL_MAX_TOKENS)
through one :class:`~waferrt.decode.shards.LayerShard` on the largest square of cores at its region's corner
(:func:`gemm_region`): every matrix product is a MeshGEMM kernel (waferrt.kernels.gemm: the QKV projection,
the output projection, gate and up as one, down) and the heads' causal attention the transposed MeshGEMM
for Q.K^T and MeshGEMM for P.V, every head's blocks moving together (waferrt.kernels.attention; a K/V head's
blocks go with each of its query heads), each moving its blocks hop by hop on the
region's lines and booking them. Between the kernels the glue runs on the tile's full matrices (RMSNorm,
RoPE, SiLU, the residual adds: booked at ``ELEMENTWISE_FLOPS`` per element, spread over the square's cores;
every GEMM's activation operand aligned into MeshGEMM's A layout: booked as ``skew_cost``, the closed form
the kernels' skew is tested to book). The layer's weights move from the decode's layout into the GEMMs'
and back, and the prompt's K/V from the GEMMs' layout into the decode's shift-based cache
(:class:`~waferrt.decode.kvcache.MeshKVCache`, filled as the decode would have filled it), each booked as
one ``layout_move`` over the region. The residual stream enters and leaves in the decode's layout, so the
decode continues from the K/V the prefill left. :func:`prefill_layer_cost` is what a layer's prefill books,
in closed form (tested equal): the kernels move float32 values (``EMULATED_VALUES``) and the cores compute at
the storage dtype's rate (the shard's ``Ledger(spec, dtype)``, ``Decoding.dtype``), as the decode's tiles do;
:func:`prefill_runs` finds the whole prompts in a micro-batch.
"""

from __future__ import annotations

from functools import lru_cache, partial

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, total
from waferrt.core.dtypes import itemsize, to_f32
from waferrt.core.gemm_cost import AttentionShape, GemmShape, attention_cost, gemm_cost, layout_move, skew_cost
from waferrt.core.layout import from_blocks
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.fabric.comm import LineComm, Span
from waferrt.fabric.kernel import Context
from waferrt.kernels.attention import PromptAttention, causal_attention
from waferrt.kernels.gemm import Grid, collect, meshgemm, place, spread
from waferrt.model.config import LlamaConfig
from waferrt.model.reference import apply_rope, rmsnorm, rope_cos_sin, silu

from .cost import ELEMENTWISE_FLOPS as EW
from .cost import Decoding, handover_bytes, handover_cost
from .layout import layer_layouts
from .pack import Chunks, blocks_of

PREFILL_MAX_TOKENS = 512  # a prompt this long or shorter enters whole and is prefilled by MeshGEMM
EMULATED_VALUES = "float32"  # what the emulated prefill's kernels move: the weights unpacked to float32


def gemm_region(region: Region) -> Region:
    """The largest square of cores at the region's corner: where the prefill's GEMMs run."""
    s = min(region.w, region.h)
    return Region(region.x0, region.y0, s, s)


def prefill_runs(meta: np.ndarray) -> list[np.ndarray]:
    """The items of a micro-batch (meta rows (slot, token, pos, want, request)) that are a whole prompt: every
    run of items of one slot whose positions are 0, 1, ..., T-1 (T from 2 to PREFILL_MAX_TOKENS)."""
    runs = []
    for slot in np.unique(meta[:, 0]):
        idx = np.flatnonzero(meta[:, 0] == slot)
        if 2 <= len(idx) <= PREFILL_MAX_TOKENS and np.array_equal(meta[idx, 2], np.arange(len(idx))):
            runs.append(idx)
    return runs


# -- the layer's weights back in full, from the decode's blocks -------------------------------------------
def full_weights(config: LlamaConfig, region: Region, arrays: dict, dtype: str) -> dict[str, np.ndarray]:
    """A LayerShard's packed arrays as the float32 matrices (y = W @ x) of the reference's LayerWeights."""
    lay, R, C = layer_layouts(config, region), region.h, region.w
    nh, nkv, hd = config.n_heads, config.n_kv_heads, config.head_dim
    hd_r = arrays["wqkv"].shape[0] // (R * (nh + 2 * nkv))
    qkv = blocks_of(to_f32(arrays["wqkv"], dtype), "y", region).reshape(R, C, nh + 2 * nkv, hd_r, -1)
    w13 = blocks_of(to_f32(arrays["w13"], dtype), "y", region).reshape(R, C, 2, -1, arrays["w13"].shape[1] // C)
    wo = blocks_of(to_f32(arrays["wo"], dtype), "x", region).reshape(R, C, -1, nh, hd_r)
    w2 = blocks_of(to_f32(arrays["w2"], dtype), "x", region)
    return {
        "wq": from_blocks(qkv[:, :, :nh], lay["wq"]).reshape(nh * hd, config.dim),
        "wk": from_blocks(qkv[:, :, nh:nh + nkv], lay["wk"]).reshape(nkv * hd, config.dim),
        "wv": from_blocks(qkv[:, :, nh + nkv:], lay["wv"]).reshape(nkv * hd, config.dim),
        "wo": from_blocks(wo, lay["wo"]).reshape(config.dim, nh * hd),
        "w_gate": from_blocks(w13[:, :, 0], lay["w_gate"]), "w_up": from_blocks(w13[:, :, 1], lay["w_up"]),
        "w_down": from_blocks(w2, lay["w_down"]),
        "attn_norm": from_blocks(to_f32(arrays["attn_norm"], dtype)[None], lay["attn_norm"]),
        "ffn_norm": from_blocks(to_f32(arrays["ffn_norm"], dtype)[None], lay["ffn_norm"]),
    }


def _weights(shard) -> dict[str, np.ndarray]:
    """The shard's full weights, unpacked once for the arrays it holds (kept with the shard)."""
    kept = getattr(shard, "prefill_weights", None)
    if kept is None or kept[0] is not shard.arrays:
        kept = shard.prefill_weights = (shard.arrays, full_weights(shard.config, shard.region, shard.arrays,
                                                                    shard.dtype))
    return kept[1]


# -- the layer ------------------------------------------------------------------------------------------
class _Mesh:
    """The prefill's kernels on a layer's square of cores: products in, full matrices out."""

    def __init__(self, region: Region, ledger: Ledger):
        self.region = gemm_region(region)
        self.ctx = Context(Span.of(self.region), ledger, {})
        self.grid, self.ledger, self.side = Grid.of(self.region), ledger, self.region.w

    def gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (m, k) @ b (k, n) by MeshGEMM, a aligned into the A layout first (booked as its skew)."""
        pa, pb = place("meshgemm", self.grid, self.region.shape, a, b)
        mb, kb = pa.shape[3:]
        self.ledger.add(skew_cost(self.ledger.spec, self.side, mb * kb * pa.itemsize))
        return collect("meshgemm", self.grid, meshgemm(self.ctx, pa, pb), a.shape[0], b.shape[1])

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Every head's causal attention at once, q k v (T, H, hd) -> (T, H, hd)."""
        T, H, hd = q.shape
        blocks = {n: np.stack([spread(self.grid, self.region.shape, m[:, h]) for h in range(H)], axis=2)
                  for n, m in (("q", q), ("k", k), ("v", v))}
        run = partial(causal_attention, prompt=PromptAttention(T, 1.0 / np.sqrt(hd), EW["softmax"]))
        out = run(self.ctx, **blocks)
        return np.stack([collect("meshgemm", self.grid, out[:, :, h], T, hd) for h in range(H)], axis=1)

    def elementwise(self, flops: int) -> None:
        self.ledger.compute(cdiv(flops, self.side * self.side))


def glue_flops(config: LlamaConfig, tokens: int) -> tuple[int, int, int]:
    """The element-wise flops of a layer's prefill, in the order they are booked: RoPE on Q and K, the first
    RMSNorm, then the second RMSNorm, the two residual adds and SiLU(gate) * up."""
    T = tokens
    return (EW["rope"] * T * (config.n_heads + config.n_kv_heads) * config.head_dim, EW["rmsnorm"] * T * config.dim,
            (EW["rmsnorm"] + 2 * EW["residual"]) * T * config.dim + EW["silu_mul"] * T * config.hidden_dim)


def _attention_block(mesh: _Mesh, config: LlamaConfig, h: np.ndarray, w: dict) -> tuple[np.ndarray, ...]:
    """h (T, dim) -> (the heads' outputs (T, nh*hd), k (T, nkv, hd), v (T, nkv, hd)): one QKV projection,
    then every query head's attention at once (each with its K/V head's blocks)."""
    T, hd, nh, nkv = h.shape[0], config.head_dim, config.n_heads, config.n_kv_heads
    cos, sin = rope_cos_sin(np.arange(T), hd, config.rope_theta)  # (T, hd/2)
    qkv = mesh.gemm(h, np.concatenate([w["wq"], w["wk"], w["wv"]]).T).reshape(T, nh + 2 * nkv, hd)
    q, k = (apply_rope(a, cos[:, None], sin[:, None]) for a in (qkv[:, :nh], qkv[:, nh:nh + nkv]))
    v = qkv[:, nh + nkv:]
    mesh.elementwise(glue_flops(config, T)[0])
    rep = nh // nkv
    out = mesh.attention(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1))  # (T, nh, hd)
    return out.reshape(T, nh * hd), k, v


def prefill_layer(shard, x: np.ndarray, slot: int) -> np.ndarray:
    """A whole prompt x (T, C, dim_c), the decode's residual layout, through `shard` (module doc) -> the same
    layout; its K/V go into the shard's cache for `slot` as the decode would have put them."""
    config, region, ledger = shard.config, shard.region, shard.ledger
    T, chunks = x.shape[0], Chunks(config.dim, region.w)
    w = _weights(shard)
    mesh = _Mesh(region, ledger)
    with ledger.op("prefill"):
        ledger.add(layout_move(ledger.spec, region, weights_core_bytes(config, region, EMULATED_VALUES)))  # in
        xf = chunks.join(x)  # (T, dim)
        h = rmsnorm(xf, w["attn_norm"], config.norm_eps)
        mesh.elementwise(glue_flops(config, T)[1])
        att, k, v = _attention_block(mesh, config, h, w)
        xf = xf + mesh.gemm(att, w["wo"].T)
        h = rmsnorm(xf, w["ffn_norm"], config.norm_eps)
        gate, up = np.split(mesh.gemm(h, np.concatenate([w["w_gate"], w["w_up"]]).T), 2, axis=1)
        xf = xf + mesh.gemm(silu(gate) * up, w["w_down"].T)
        mesh.elementwise(glue_flops(config, T)[2])
        _fill_cache(shard, slot, k, v)
        ledger.add(layout_move(ledger.spec, region, weights_core_bytes(config, region, EMULATED_VALUES)))  # back
    return chunks.split(xf)


def weights_core_bytes(config: LlamaConfig, region: Region, dtype: str = "float32") -> int:
    """A layer's weights per core of its region as `dtype` values (the emulator's GEMMs take them as
    EMULATED_VALUES): what moves between the decode's and the GEMMs' layouts."""
    return cdiv(itemsize(dtype) * config.layer_params(), region.size)


def kv_core_bytes(config: LlamaConfig, region: Region, tokens: int, dtype: str = "float32") -> int:
    """A prompt's K and V per core of the region: what moves into the decode's cache."""
    return cdiv(2 * itemsize(dtype) * tokens * config.kv_dim, region.size)


def _fill_cache(shard, slot: int, k: np.ndarray, v: np.ndarray) -> None:
    """The prompt's K, V (T, nkv, hd) into the shard's cache as the decode would have left them, booked as one
    layout move (the cache's own shifts, which a decode books one position at a time, go to a scratch
    ledger)."""
    config, region, T = shard.config, shard.region, k.shape[0]
    rows, hd_r = region.h, shard.hd_r
    lay = layer_layouts(config, region)["wk"]  # head_dim over the rows, in whole pairs, as the cache holds it
    def per_row(a: np.ndarray) -> np.ndarray:  # (T, nkv, hd) -> (T, R, nkv, hd_r)
        out = np.zeros((T, rows, config.n_kv_heads, hd_r), np.float32)
        for r in range(rows):
            sl = lay.block_slices(r, 0)[1]
            out[:, r, :, :sl.stop - sl.start] = a[:, :, sl]
        return out

    own = shard.kv.comm
    shard.kv.comm = LineComm("x", Span.of(region), Ledger(shard.ledger.spec))
    try:
        shard.kv.insert(np.full(T, slot), per_row(k), per_row(v), np.arange(T))
    finally:
        shard.kv.comm = own
    shard.ledger.add(layout_move(shard.ledger.spec, region, kv_core_bytes(config, region, T, EMULATED_VALUES)))


@lru_cache(maxsize=1024)
def prefill_layer_parts(spec, dec: Decoding, region: Region, tokens: int, context: int | None = None,
                        moved: str | None = None) -> tuple[tuple[str, str, Cost], ...]:
    """(name, category, Cost) of a layer's prefill of `tokens` prompt tokens on `region`: the cores compute
    at ``dec.dtype``'s rate, values move as `moved` (default ``dec.dtype``): what :func:`prefill_layer`
    books with ``moved=EMULATED_VALUES`` and ``context`` None. With a `context` longer than `tokens` (a
    chunk of a longer prompt, on paper only), the chunk's attention is its share (tokens / context of the
    score rows) of the whole context's."""
    config, rate, moved = dec.config, dec.dtype, moved or dec.dtype
    s, T, hd, dim, size = min(region.w, region.h), tokens, config.head_dim, config.dim, itemsize(moved)

    def mm(name: str, m: int, k: int, n: int) -> tuple[str, str, Cost]:
        return name, "gemm", (skew_cost(spec, s, cdiv(m, s) * cdiv(k, s) * size)
                              + gemm_cost(spec, "meshgemm", GemmShape(m, k, n, s, s), moved, 1, rate))

    ctx = context or T
    att = attention_cost(spec, AttentionShape(ctx, hd, config.n_heads, s), EW["softmax"], moved, rate)
    if ctx != T:
        att = Cost(*(type(v)(v * T / ctx) for v in att.as_dict().values()))
    glue = [dec.flops(spec, cdiv(f, s * s)) for f in glue_flops(config, T)]
    return (mm("qkv", T, dim, dim + 2 * config.kv_dim), ("attention", "attention", att),
            mm("o", T, config.n_heads * hd, dim), mm("gate_up", T, dim, 2 * config.hidden_dim),
            mm("down", T, config.hidden_dim, dim),
            ("elementwise", "elementwise", glue[0] + glue[1] + glue[2]),
            ("weights_in_out", "layout", layout_move(spec, region, weights_core_bytes(config, region, moved)).scaled(2)),
            ("kv_to_decode", "layout", layout_move(spec, region, kv_core_bytes(config, region, T, moved))))


def prefill_layer_cost(spec, dec: Decoding, region: Region, tokens: int) -> Cost:
    """What :func:`prefill_layer` books for a prompt of `tokens` on `region`, in closed form."""
    return total(c for _, _, c in prefill_layer_parts(spec, dec, region, tokens, None, EMULATED_VALUES))


def prefill_item_cycles(spec, dec: Decoding, prev: Region, region: Region, tokens: int) -> float:
    """A prompt token's share of its layer's prefill (the schedule's "alone" cycles of each of the prompt's
    `tokens` items), the hand-over into the region included, as decode.cost.alone_cycles counts a token's."""
    return handover_cost(spec, prev, region, handover_bytes(dec.config, 1)).cycles + \
        prefill_layer_cost(spec, dec, region, tokens).cycles / tokens


def layer_step(shard, x: np.ndarray, meta: np.ndarray) -> np.ndarray:
    """A micro-batch through a layer: its whole prompts (prefill_runs) prefilled by MeshGEMM, the other items
    decoded (LayerShard.forward); x (B, C, dim_c) -> the same."""
    runs = prefill_runs(meta)
    if not runs:
        return shard.forward(x, meta[:, 0], meta[:, 2])
    out = np.empty_like(x)
    for idx in runs:
        out[idx] = prefill_layer(shard, x[idx], int(meta[idx[0], 0]))
    rest = np.setdiff1d(np.arange(len(meta)), np.concatenate(runs))
    if len(rest):
        out[rest] = shard.forward(x[rest], meta[rest, 0], meta[rest, 2])
    return out
