"""The prefill on the emulated wafer: a prompt through a layer as mesh GEMMs, leaving its K/V for the decode.

Contract: :func:`prefill_layer` runs a chunk of a request's prompt (positions start..start+T-1, T <=
PREFILL_MAX_TOKENS; a whole prompt is the chunk at 0) through one :class:`~waferrt.decode.shards.LayerShard`
with the decode's own block functions (decode.shards.attention_in, attention_out: the RMSNorms, the
projections, RoPE, the residual adds, the MLP) on a :class:`~waferrt.decode.net.SquareNet` -- the chunk as one
slab (T, 1, dim) on the largest square of cores at its region's corner, every projection a MeshGEMM kernel
(waferrt.kernels.gemm: the QKV projection, the output projection, gate and up as one, down), the element-wise
work recorded spread over the square's cores, every GEMM's activation operand aligned into MeshGEMM's A layout
(its skew recorded). The heads' causal attention is the MeshGEMM attention kernel (the transposed MeshGEMM for
Q.K^T and MeshGEMM for P.V over the chunk and the positions before it that the cache holds; sparse under a
sparse ``LayerShard.attention``: waferrt.decode.sparse_prefill), every head's blocks moving together
(waferrt.kernels.attention; a K/V head's blocks go with each of its query heads), moving its blocks hop by
hop on the square's lines and booking them. No flop is booked by hand here: what the block functions do is
what the Net records. The layer's weights move from the
decode's blocks into the GEMMs' and back, the QKV product's Q, K, V into the heads' blocks, the cached K/V (a later
chunk) into the attention's blocks, the chunk's K/V into the decode's shift-based cache (filled as the decode would have
filled it, its older entries moving east): each a move of decode.relayout, every value's message routed hop by hop
and booked per link, the values carried by decode.transport (hop by hop when the shard's collectives are the checked
mode, at once on the fast path) into the blocks the kernels and the cache then use. The residual stream enters
and leaves in the decode's layout, so the decode (or the next chunk) continues from the K/V the prefill left.
:func:`prefill_layer_cost` is what a layer's prefill books, in closed form (tested equal): the kernels move
float32 values (``EMULATED_VALUES``) and the cores compute at the storage dtype's rate (the shard's
``Ledger(spec, dtype)``, ``Decoding.dtype``), as the decode's tiles do; :func:`prefill_runs` finds the prompts'
chunks in a micro-batch.
"""

from __future__ import annotations

from functools import lru_cache, partial

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, total
from waferrt.core.dtypes import itemsize, to_f32
from waferrt.core.gemm_cost import AttentionShape, GemmShape, gemm_cost, skew_cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.fabric.comm import LineComm, Span
from waferrt.kernels.attention import PromptAttention, causal_attention
from waferrt.kernels.gemm import collect, spread
from waferrt.model.config import LlamaConfig
from waferrt.model.reference import rope_cos_sin
from waferrt.model.sparse import AttentionMode

from .cost import stage_handover
from .decoding import ELEMENTWISE_FLOPS as EW
from .decoding import Decoding
from .kernel_net import KernelNet
from .kvcache import PromptChunk
from .net import Blocks, SquareNet
from .pack import Chunks, out_in
from .prefill_plan import GEMMS, arrivals, cache_buffer, head_moves, read_move, weight_moves
from .relayout import heads_load, kv_load, kv_read_load, move_cost, weights_load
from .rows import Col
from .shards import On, attention_in, attention_out, dense_ffn, pairwise
from .sparse_prefill import prefill_attention_parts, selector
from .stage import Entry
from .transport import carry

PREFILL_MAX_TOKENS = 512  # a prompt this long or shorter enters whole; a longer one in chunks of this many
EMULATED_VALUES = "float32"  # what the emulated prefill's kernels move: the weights unpacked to float32


def prefill_runs(meta: np.ndarray) -> list[np.ndarray]:
    """The items of a micro-batch (meta rows, decode.rows.Col) that are a prompt's chunk:
    every run of items of one slot whose positions are p, p + 1, ..., p + T - 1 (T from 2 to
    PREFILL_MAX_TOKENS; p = 0 for a whole prompt or its first chunk, the positions before it already
    cached for a later chunk)."""
    runs = []
    for slot in np.unique(meta[:, Col.SLOT]):
        idx = np.flatnonzero(meta[:, Col.SLOT] == slot)
        pos = meta[idx, Col.POS]
        if 2 <= len(idx) <= PREFILL_MAX_TOKENS and np.array_equal(pos, pos[0] + np.arange(len(idx))):
            runs.append(idx)
    return runs


# -- the layer ------------------------------------------------------------------------------------------
def _attention(net: SquareNet, blocks: tuple[np.ndarray, ...], prompt: PromptAttention, mode: AttentionMode,
               hd: int) -> np.ndarray:
    """Every head's causal attention at once, dense or sparse (`mode`, decode.sparse_prefill), over the C
    blocks = (q (rows, cols, H, mb, db) of the prompt's tokens, k, v (rows, cols, H, kb, db) of its start +
    tokens context positions) -> (tokens, H * hd)."""
    out = causal_attention(KernelNet(net.ctx), *blocks, prompt=prompt, select=selector(mode, prompt))
    return np.concatenate([collect("meshgemm", net.grid, out[:, :, h], prompt.tokens, hd)
                           for h in range(out.shape[2])], axis=1)


def glue_flops(config: LlamaConfig, tokens: int) -> tuple[int, ...]:
    """The element-wise flops of a layer's prefill over its slab of `tokens`, op by op as the block functions
    record them (decode.shards): the first RMSNorm, RoPE on Q and K, the residual add, the second RMSNorm,
    SiLU(gate) * up, the residual add."""
    T, dim = tokens, config.dim
    return (EW["rmsnorm"] * T * dim, EW["rope"] * T * (config.n_heads + config.n_kv_heads) * config.head_dim,
            EW["residual"] * T * dim, EW["rmsnorm"] * T * dim, EW["silu_mul"] * T * config.hidden_dim,
            EW["residual"] * T * dim)


def _attention_block(net: SquareNet, shard, qkv: np.ndarray, chunk: PromptChunk, slot: int) -> np.ndarray:
    """qkv (T, nh + 2 nkv, hd) of the prompt `chunk` of the request in `slot`, its Q and K RoPE'd -> the heads'
    outputs (T, nh*hd): the product's Q, K, V carried into the heads' blocks (K and V with those carried out of
    the cache: the context), every query head's attention at once (each with its K/V head's blocks), the
    chunk's K/V carried into the cache."""
    config, start, hop = shard.config, chunk.start, not shard.coll.fast
    home = Region(0, 0, shard.region.w, shard.region.h)  # the moves' plans: one per region shape
    T, hd, nh, nkv = chunk.tokens, config.head_dim, config.n_heads, config.n_kv_heads
    product = spread(net.grid, net.region, qkv.reshape(T, -1))  # RoPE'd where the product lies
    moves = head_moves(config, home, chunk)
    kv = carry(moves.kv, product, hop)  # (s, s, 2, nkv, kb, db)
    if start:
        cached = cache_buffer(config, home, *shard.kv.ordered(slot, start))
        carry(read_move(config, home, chunk), cached, hop, out=kv)
    rep = nh // nkv
    blocks = (carry(moves.q, product, hop), np.repeat(kv[:, :, 0], rep, axis=2), np.repeat(kv[:, :, 1], rep, axis=2))
    prompt = PromptAttention(T, 1.0 / np.sqrt(hd), start=start)
    out = _attention(net, blocks, prompt, shard.attention, hd)
    k, v = arrivals(config, home, chunk, carry(moves.cache, product, hop))
    _fill_cache(shard, slot, start, k, v)
    return out


def prefill_layer(shard, x: np.ndarray, slot: int, start: int = 0) -> np.ndarray:
    """A prompt's chunk x (T, C, dim_c) at positions start..start+T-1, the decode's residual layout, through
    `shard` (module doc) -> the same layout; its K/V go into the shard's cache for `slot` as the decode would
    have put them (the cache holds the `start` positions before it), the layer's weights back into the decode's
    blocks. The layer's math is the decode's block functions (decode.shards.attention_in, attention_out) on a
    SquareNet over the chunk's slab (T, 1, dim)."""
    config, region, ledger, hop = shard.config, shard.region, shard.ledger, not shard.coll.fast
    T, chunks, chunk = x.shape[0], Chunks(config.dim, region.w), PromptChunk(start, x.shape[0])
    net = SquareNet(region, ledger)
    dec = Decoding(config, shard.dtype, attention=shard.attention)
    moves = {name: c for name, _, c in prefill_moves(ledger.spec, dec, region, chunk, EMULATED_VALUES)}
    plan = weight_moves(config, Region(0, 0, region.w, region.h), tuple(shard.arrays[key].shape for _, key, _ in GEMMS))
    weights = weights_move(ledger.spec, dec, region, EMULATED_VALUES)  # in, and the same way back
    with ledger.op("prefill"):
        held = {wm.key: carry(wm.into, shard.arrays[wm.key], hop) for wm in plan}  # the weights in
        ledger.add(weights)
        w = {key: Blocks(to_f32(a, shard.dtype), _width(config, key)) for key, a in held.items()}
        w |= {n: chunks.join(to_f32(shard.arrays[n], shard.dtype)[None]) for n in ("attn_norm", "ffn_norm")}  # (1, dim)
        on = On(net, *net.lines, config, w.__getitem__)
        for name in ("kv_from_cache", "qkv_to_heads", "kv_to_decode"):
            ledger.add(moves.get(name, Cost()))
        xs = chunks.join(x)[:, None]  # (T, 1, dim): the chunk's slab
        cos, sin = rope_cos_sin(start + np.arange(T), config.head_dim, config.rope_theta)  # (T, hd/2)
        qkv, qk = attention_in(on, xs, pairwise(cos[:, None, None], sin[:, None, None]))  # (T, 1, heads, hd)
        qkv[:, :, :qk.shape[2]] = qk
        att = _attention_block(net, shard, qkv[:, 0], chunk, slot)  # (T, nh * hd)
        xs = attention_out(on, xs, att[:, None], partial(dense_ffn, on))
        for wm in plan:  # and back into the decode's blocks
            shard.arrays[wm.key] = out_in(carry(wm.back, held[wm.key], hop), wm.out_over)
        ledger.add(weights)
    return chunks.split(xs[:, 0])


def _width(config: LlamaConfig, key: str) -> int:
    """The output columns of a GEMM's weight (prefill_plan.GEMMS's arrays): QKV's, the output projection's,
    gate's and up's side by side, down's."""
    return {"wqkv": (config.n_heads + 2 * config.n_kv_heads) * config.head_dim, "wo": config.dim,
            "w13": 2 * config.hidden_dim, "w2": config.dim}[key]


def _fill_cache(shard, slot: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
    """The chunk's K, V (T, R, nkv, hd_r) as the cache's cores took them into the shard's cache at positions
    start.. as the decode would have left them (booked by the caller as the move decode.relayout.kv_load
    routes; the cache's own shifts, which a decode books one position at a time, go to a scratch ledger)."""
    T = k.shape[0]
    own = shard.kv.comm
    shard.kv.comm = LineComm("x", Span.of(shard.region), Ledger(shard.ledger.spec))
    try:
        shard.kv.insert(np.full(T, slot), k, v, start + np.arange(T))
    finally:
        shard.kv.comm = own


def weights_move(spec, dec: Decoding, region: Region, moved: str) -> Cost:
    """A layer's weights from the decode's blocks into the prefill's GEMMs' (or back), values of `moved`:
    the move decode.relayout.weights_load routes."""
    at = Region(0, 0, region.w, region.h)
    return move_cost(spec, weights_load(dec.config, at, dec.head_groups, itemsize(moved)))


@lru_cache(maxsize=1024)
def prefill_moves(spec, dec: Decoding, region: Region, chunk: PromptChunk, moved: str
                  ) -> tuple[tuple[str, str, Cost], ...]:
    """(name, "layout", Cost) of a prompt `chunk`'s layout moves (decode.relayout, values of `moved`): the
    weights into the GEMMs' blocks and back, the cached K/V into the attention's blocks (a chunk after the
    first), the chunk's K/V into the decode's cache."""
    config, at, size, g = dec.config, Region(0, 0, region.w, region.h), itemsize(moved), dec.head_groups
    out = [("weights_in_out", weights_move(spec, dec, region, moved).scaled(2))]
    if chunk.start:
        out.append(("kv_from_cache", move_cost(spec, kv_read_load(config, at, chunk, g, size))))
    out.append(("qkv_to_heads", move_cost(spec, heads_load(config, at, chunk, size))))
    out.append(("kv_to_decode", move_cost(spec, kv_load(config, at, chunk, g, size))))
    return tuple((name, "layout", c) for name, c in out)


@lru_cache(maxsize=1024)
def prefill_work_parts(spec, dec: Decoding, region: Region, tokens: int, context: int | None = None,
                       moved: str | None = None) -> tuple[tuple[str, str, Cost], ...]:
    """(name, category, Cost) of a layer's prefill of `tokens` prompt tokens on `region` but its layout moves
    (:func:`prefill_moves`): the GEMMs, the attention, the element-wise work. The cores compute at
    ``dec.dtype``'s rate, values move as `moved` (default ``dec.dtype``). With a `context` longer than
    `tokens`, the tokens are the last chunk of a prompt of `context` positions, the cache holding those
    before it."""
    config, rate, moved = dec.config, dec.dtype, moved or dec.dtype
    s, T, hd, dim, size = min(region.w, region.h), tokens, config.head_dim, config.dim, itemsize(moved)

    def mm(name: str, m: int, k: int, n: int) -> tuple[str, str, Cost]:
        return name, "gemm", (skew_cost(spec, s, cdiv(m, s) * cdiv(k, s) * size)
                              + gemm_cost(spec, "meshgemm", GemmShape(m, k, n, s, s), moved, 1, rate))

    ctx = context or T
    att = prefill_attention_parts(spec, AttentionShape(T, hd, config.n_heads, s, ctx), dec.attention, moved, rate)
    glue = total(dec.flops(spec, cdiv(f, s * s)) for f in glue_flops(config, T))
    return (mm("qkv", T, dim, dim + 2 * config.kv_dim), *att, mm("o", T, config.n_heads * hd, dim),
            mm("gate_up", T, dim, 2 * config.hidden_dim), mm("down", T, config.hidden_dim, dim),
            ("elementwise", "elementwise", glue))


def prefill_layer_parts(spec, dec: Decoding, region: Region, tokens: int, context: int | None = None,
                        moved: str | None = None) -> tuple[tuple[str, str, Cost], ...]:
    """(name, category, Cost) of every piece of a layer's prefill (:func:`prefill_work_parts`, then
    :func:`prefill_moves`): what :func:`prefill_layer` books with ``moved=EMULATED_VALUES``."""
    ctx = context or tokens
    return (prefill_work_parts(spec, dec, region, tokens, ctx, moved)
            + prefill_moves(spec, dec, region, PromptChunk(ctx - tokens, tokens), moved or dec.dtype))


def prefill_layer_cost(spec, dec: Decoding, region: Region, tokens: int, start: int = 0) -> Cost:
    """What :func:`prefill_layer` books for a prompt's chunk of `tokens` at `start` on `region`, in closed
    form."""
    parts = prefill_layer_parts(spec, dec, region, tokens, start + tokens, EMULATED_VALUES)
    return total(c for _, _, c in parts)


def prefill_item_cycles(spec, dec: Decoding, entry: Entry, chunk: PromptChunk) -> float:
    """A prompt token's share of its layer stage's prefill of a prompt `chunk` (the schedule's "alone" cycles
    of each of the chunk's items): the chunk's hand-over into the stage's region from the previous one
    (`entry`: decode.stage.Entry; decode.cost.stage_handover, what the tiles book for the micro-batch) and its
    prefill, over its tokens."""
    region, tokens = entry.region, chunk.tokens
    return (stage_handover(spec, dec.config, entry.src, region, tokens).cycles
            + prefill_layer_cost(spec, dec, region, tokens, chunk.start).cycles) / tokens


def layer_step(shard, x: np.ndarray, meta: np.ndarray) -> np.ndarray:
    """A micro-batch through a layer: its whole prompts (prefill_runs) prefilled by MeshGEMM, the other items
    decoded (LayerShard.forward); x (B, C, dim_c) -> the same."""
    runs = prefill_runs(meta)
    if not runs:
        return shard.forward(x, meta[:, Col.SLOT], meta[:, Col.POS])
    out = np.empty_like(x)
    for idx in runs:
        out[idx] = prefill_layer(shard, x[idx], int(meta[idx[0], Col.SLOT]), int(meta[idx[0], Col.POS]))
    rest = np.setdiff1d(np.arange(len(meta)), np.concatenate(runs))
    if len(rest):
        out[rest] = shard.forward(x[rest], meta[rest, Col.SLOT], meta[rest, Col.POS])
    return out
