"""Where a Llama decoder's tensors sit inside a region of cores, for decode (MeshGEMV layout).

Contract: pure functions from (LlamaConfig, Region, dtype) to :class:`~waferrt.core.layout.Layout`
values, and from those to what a region keeps in its cores' SRAM (:func:`layer_booking`: g layers stacked
in one region, their weight blocks and K/V on the same cores with one scratch area; :func:`embed_booking`;
:func:`stream_booking`, a region whose weights stream in from off-wafer: every layer's K/V, a double buffer
of weight blocks, one scratch area; every booked name as layouts; :func:`booked_bytes` per core,
:func:`most_bytes` on the most loaded core). Both the scheduler (SRAM budgets) and the
tiles (SRAM booking) use exactly these, so what is planned is what runs.

The scheme (WaferLLM's MeshGEMV with alternating axes): the residual stream x (dim,) is split over the
region's columns and replicated down its rows. A matrix whose input is split over columns has its output
split over rows (allreduce along rows), and the next matrix takes that row-split input back to a
column-split output (allreduce along columns), so no transpose is ever needed:

    x (dim: x)  --wq/wk/wv (heads, head_dim: y, dim: x)-->  q, k, v (head_dim split over rows)
    attn (head_dim: y) --wo (dim: x, heads, head_dim: y)--> x (dim: x)
    x (dim: x)  --w_gate/w_up (hidden: y, dim: x)-->        h (hidden: y)
    h (hidden: y) --w_down (dim: x, hidden: y)-->           x (dim: x)

head_dim is cut in whole RoPE pairs (granule 2), so RoPE is local. The KV cache of one request holds
(n_kv_heads, head_dim: y, positions: x): head_dim over rows like q, sequence positions over columns,
balanced by shifting. The tied embedding/head table (vocab: y, dim: x) lives in its own region.
An MoE layer (config.n_experts > 0) has the router over the region (like w_gate), its shared expert (if any)
as the dense FFN, and its experts on blocks of the region (waferrt.decode.moe_layout), booked as
"experts": the most any mapping puts on a core, on every core.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.dtypes import itemsize
from waferrt.core.layout import Layout, core_bytes
from waferrt.core.mesh import Region
from waferrt.model.config import LlamaConfig
from waferrt.model.sparse import AttentionMode

from .cost import layer_dims
from .moe_layout import expert_core_bytes, moe_scratch_words, router_layout
from .topk import TopKRow, buffer_bytes

LAYER_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")


def layer_layouts(config: LlamaConfig, region: Region, dtype: str = "float32") -> dict[str, Layout]:
    """Layouts of one decoder layer's weights over `region` (names as in LAYER_WEIGHTS; an MoE layer has
    "router" and "experts" instead of the dense FFN, which it keeps only as its shared expert)."""
    hd, nh, nkv, ffn = config.head_dim, config.n_heads, config.n_kv_heads, config.dense_hidden
    out = {
        "attn_norm": Layout((config.dim,), region, ("x",), dtype=dtype),
        "wq": Layout((nh, hd, config.dim), region, (None, "y", "x"), (1, 2, 1), dtype),
        "wk": Layout((nkv, hd, config.dim), region, (None, "y", "x"), (1, 2, 1), dtype),
        "wv": Layout((nkv, hd, config.dim), region, (None, "y", "x"), (1, 2, 1), dtype),
        "wo": Layout((config.dim, nh, hd), region, ("x", None, "y"), (1, 1, 2), dtype),
        "ffn_norm": Layout((config.dim,), region, ("x",), dtype=dtype),
    }
    if ffn:
        out.update(w_gate=Layout((ffn, config.dim), region, ("y", "x"), dtype=dtype),
                   w_up=Layout((ffn, config.dim), region, ("y", "x"), dtype=dtype),
                   w_down=Layout((config.dim, ffn), region, ("x", "y"), dtype=dtype))
    if config.moe:
        out.update(router=router_layout(config, region, dtype),
                   experts=scratch_layout(region, expert_core_bytes(config, region, dtype)))
    return out


def kv_layout(config: LlamaConfig, region: Region, tokens: int, dtype: str = "float32") -> Layout:
    """One request's K (or V) cache of `tokens` positions in one layer's region."""
    return Layout((config.n_kv_heads, config.head_dim, tokens), region, (None, "y", "x"), (1, 2, 1), dtype)


def embed_layout(config: LlamaConfig, region: Region, dtype: str = "float32") -> Layout:
    """The tied embedding / output head table (vocab rows over region rows, dim over columns)."""
    return Layout((config.vocab_size, config.dim), region, ("y", "x"), dtype=dtype)


def final_norm_layout(config: LlamaConfig, region: Region, dtype: str = "float32") -> Layout:
    return Layout((config.dim,), region, ("x",), dtype=dtype)


def activation_bytes(config: LlamaConfig, region: Region, tokens: int, head_groups: int = 1) -> int:
    """Upper bound of one core's float32 scratch for one decode step of one request in a layer region (its
    heads in `head_groups` groups over the rows: ``decode.cost.layer_dims``): x, norm(x), q/k/v, attention
    output, the MLP hidden pair, per-position scores, and a same-size receive buffer for each in-flight
    allreduce (the fabric buffers). The one owner of a layer core's scratch (the estimator's too)."""
    d = layer_dims(config, region.w, region.h, head_groups)
    hq, hd_r = d["hq"], d["hd_r"]
    words = 2 * d["dim_c"] + (2 * hq + 2 * d["hk"]) * hd_r + 2 * d["hid_r"] + hq * cdiv(tokens, region.w)
    if config.moe:
        words += moe_scratch_words(config, region)
    return 2 * words * 4  # x2: receive buffers of the reductions


def kv_core_bytes(config: LlamaConfig, region: Region, kv_tokens: int, requests: int, dtype: str = "float32",
                  head_groups: int = 1) -> int:
    """K and V of one layer on a layer region's most loaded core, for `requests` requests of `kv_tokens`
    positions (over the columns), their heads' head_dim over a head group's rows (``decode.cost.layer_dims``):
    the one owner of a core's K/V bytes (``kv_booking`` is its layout, tested equal)."""
    d = layer_dims(config, region.w, region.h, head_groups)
    return 2 * requests * d["hk"] * d["hd_r"] * cdiv(kv_tokens, region.w) * itemsize(dtype)


def embed_scratch_bytes(config: LlamaConfig, region: Region) -> int:
    """One core's float32 scratch in the embedding/head region: its logits block and its x chunk, each with a
    receive buffer."""
    return 2 * cdiv(config.vocab_size, region.h) * 4 + 2 * cdiv(config.dim, region.w) * 4


def scratch_layout(region: Region, nbytes: int) -> Layout:
    """A per-core scratch area of `nbytes` (rounded up to float32 words) on every core of `region`."""
    return Layout((cdiv(nbytes, 4),), region, (None,))


def kv_booking(config: LlamaConfig, region: Region, kv_tokens: int, requests: int, dtype: str = "float32") -> Layout:
    """K and V of one layer for `requests` requests of `kv_tokens` positions, as one layout."""
    one = kv_layout(config, region, kv_tokens, dtype)  # K (or V) of one request; K and V of every request:
    return Layout((2 * requests, *one.shape), region, (None, *one.split), (1, *one.granule), dtype)


def layer_booking(config: LlamaConfig, region: Region, kv_tokens: int, requests: int,
                  dtype: str = "float32", layers: int = 1) -> dict[str, tuple[Layout, ...]]:
    """What a layer region running `layers` layers keeps in its cores' SRAM, by booked name: "weights" (one
    layout per matrix and norm, per layer), "kv" (K and V of `requests` requests of `kv_tokens` positions,
    per layer) and "scratch" (once: the layers run one after another)."""
    return {"weights": tuple(layer_layouts(config, region, dtype).values()) * layers,
            "kv": (kv_booking(config, region, kv_tokens, requests, dtype),) * layers,
            "scratch": (scratch_layout(region, activation_bytes(config, region, kv_tokens)),)}


def topk_booking(config: LlamaConfig, region: Region, kv_tokens: int, attention: AttentionMode,
                 head_groups: int = 1) -> dict[str, tuple[Layout, ...]]:
    """What sparse attention adds to a layer region's SRAM (once a region, as the scratch): "topk", the row
    top-K's lists a core holds for one request's query heads of its head group (decode.topk.buffer_bytes: its
    own K best and a neighbour's) at the K/V reserve; nothing when every key is kept (no top-K runs)."""
    keep, held = attention.keys_kept(kv_tokens), cdiv(kv_tokens, region.w)
    if keep >= kv_tokens:
        return {}
    heads = layer_dims(config, region.w, region.h, head_groups)["hq"]
    return {"topk": (scratch_layout(region, buffer_bytes(TopKRow(region.w, held, heads, keep))),)}


def embed_booking(config: LlamaConfig, region: Region, dtype: str = "float32") -> dict[str, tuple[Layout, ...]]:
    """What the embedding/head region keeps in its cores' SRAM: "table" (the tied table and the final
    norm) and "scratch"."""
    return {"table": (embed_layout(config, region, dtype), final_norm_layout(config, region, dtype)),
            "scratch": (scratch_layout(region, embed_scratch_bytes(config, region)),)}


def layer_block_bytes(config: LlamaConfig, region: Region, dtype: str = "float32", head_groups: int = 1) -> int:
    """Bytes of one layer's weight blocks on a region's most loaded core, in closed form (equal to the
    layouts' blocks for one head group, tested; decode.cost.layer_dims for more): the two norms, wq wk wv wo,
    gate up down (an MoE's shared expert), and an MoE's router (on every row) and experts (decode.moe_layout).
    What a streamed layer brings in, and the weights of layer_core_bytes."""
    d = layer_dims(config, region.w, region.h, head_groups)
    dim_c, hid_r, hd_r, hq, hk = d["dim_c"], d["hid_r"], d["hd_r"], d["hq"], d["hk"]
    dense = (2 * dim_c + (2 * hq + 2 * hk) * hd_r * dim_c + 3 * hid_r * dim_c) * itemsize(dtype)
    if not config.moe:
        return dense
    return dense + config.n_experts * dim_c * itemsize(dtype) + expert_core_bytes(config, region, dtype)


def head_chunk_entries(config: LlamaConfig, region: Region, dtype: str = "float32", head_groups: int = 1) -> int:
    """How many of its vocabulary entries every core row of a streaming region takes in per chunk of the head:
    as many as fit in a layer's block on a core beside the final norm's chunk (at least one, at most all)."""
    voc_r, dim_c, isz = cdiv(config.vocab_size, region.h), cdiv(config.dim, region.w), itemsize(dtype)
    layer = layer_block_bytes(config, region, dtype, head_groups)
    return min(voc_r, max(1, (layer - dim_c * isz) // (dim_c * isz)))


def stream_block_bytes(config: LlamaConfig, region: Region, dtype: str = "float32", head_groups: int = 1) -> int:
    """Bytes of the largest weight block a core of a streaming region receives at once: one layer's weights,
    or a chunk of the tied table with the final norm (the head streams in chunks no larger than a layer's
    block, so this is the layer's unless one vocabulary entry per core row is larger). The double buffer
    holds two: the one source of its size, for the tiles and the estimator alike."""
    layer, dim_c = layer_block_bytes(config, region, dtype, head_groups), cdiv(config.dim, region.w)
    return max(layer, (head_chunk_entries(config, region, dtype, head_groups) + 1) * dim_c * itemsize(dtype))


def stream_booking(config: LlamaConfig, region: Region, kv_tokens: int, requests: int,
                   dtype: str = "float32") -> dict[str, tuple[Layout, ...]]:
    """What a region whose weights stream in keeps in its cores' SRAM (it runs every layer and the head):
    "kv" (every layer's K and V), "buffer" (two weight blocks: the one computed and the next one streaming
    in) and "scratch" (the larger of a layer's and the head's)."""
    scratch = max(activation_bytes(config, region, kv_tokens), embed_scratch_bytes(config, region))
    return {"kv": (kv_booking(config, region, kv_tokens, requests, dtype),) * config.n_layers,
            "buffer": (scratch_layout(region, 2 * stream_block_bytes(config, region, dtype)),),
            "scratch": (scratch_layout(region, scratch),)}


def stream_core_bytes(config: LlamaConfig, region: Region, kv_tokens: int, requests: int, dtype: str = "float32",
                      head_groups: int = 1) -> int:
    """The fullest core of a streaming region: every layer's K/V, the double buffer, and the larger of a
    layer's and the head's scratch -- the one owner of the sum (``stream_booking`` is its layouts, tested
    equal; the estimator's streaming region is this, per head group)."""
    scratch = max(activation_bytes(config, region, kv_tokens, head_groups), embed_scratch_bytes(config, region))
    return (config.n_layers * kv_core_bytes(config, region, kv_tokens, requests, dtype, head_groups) + scratch
            + 2 * stream_block_bytes(config, region, dtype, head_groups))


def booked_bytes(booking: dict[str, tuple[Layout, ...]]) -> dict[str, np.ndarray]:
    """Bytes per core (rows, cols) of every booked name: what a tile books in its SRAM."""
    return {name: sum(core_bytes(lay) for lay in lays) for name, lays in booking.items()}


def most_bytes(booking: dict[str, tuple[Layout, ...]]) -> int:
    """The bytes of the most loaded core: core (0, 0), where every layout's chunks are largest (equal to
    the maximum of the sum of :func:`booked_bytes`, without building the per-core arrays)."""
    return sum(lay.max_block_bytes() for lays in booking.values() for lay in lays)


def layer_core_bytes(config: LlamaConfig, region: Region, kv_tokens: int, requests: int,
                     dtype: str = "float32", layers: int = 1) -> int:
    """Bytes the most loaded core of a layer region running `layers` layers needs: their weights and K/V
    reserve, and one scratch area."""
    return most_bytes(layer_booking(config, region, kv_tokens, requests, dtype, layers))


def embed_core_bytes(config: LlamaConfig, region: Region, dtype: str = "float32") -> int:
    """Bytes the most loaded core of the embedding/head region needs: table + final norm + scratch."""
    return most_bytes(embed_booking(config, region, dtype))


def max_layer_rows(config: LlamaConfig) -> int:
    """A layer region may have at most this many rows: head_dim is cut in whole RoPE pairs."""
    return config.head_dim // 2
