"""The decode's cost on the modelled wafer: a layer, the head, the hand-over between regions, a decode step.

Contract: pure closed forms built from waferrt.core.cost's primitives, equal to what the emulator books
(tests/unit/test_estimate_emulator.py runs the tiles and compares hops, stages, messages, link bytes,
flops and cycles). ``layer_decode_parts`` / ``layer_decode_cost`` give one micro-batch of ``batch``
requests through one layer region (every booked piece, named, with its category), ``head_decode_cost``
the final norm and output head, ``handover_cost`` what the tiles book when activations move from one
stage's region to the next (the one formula for it), ``step_cycles`` the (stage, micro-batch) cycles a
whole decode step books, ``alone_cycles`` what one token takes alone at a stage (waferrt.decode.schedule
schedules the decode that ran with it: every request at its own pace). An MoE layer's FFN is
waferrt.decode.routed_cost's ``moe_parts`` (the router, the experts, the dispatch and the combine under the
routing ``Decoding.routing`` names); a dense FFN's is ``ffn_parts`` (decode.decoding.block_ffn_parts, the
SwiGLU an expert runs too); what sparse attention adds is ``sparse_parts``.

What the closed forms count, as the tiles do: the attention runs over ``cdiv(kv_tokens, cols)`` positions
per core (``kv_tokens``: the context the fullest request of the micro-batch holds, the new token
included; the planner times a full K/V reserve); the new K/V enter at column 0 and ``moving`` columns
pass their oldest entry one hop east (``pos % cols`` for a request at position ``pos``; the default, the
most, ``cols - 1``); messages and link bytes count every parallel line of the region; element-wise work
(RMSNorm, RoPE, softmax, SiLU, residual adds) is booked at decode.decoding's ``ELEMENTWISE_FLOPS`` per element.

What the closed forms are given travels as one frozen decode.decoding.Decoding (the model, the storage
dtype the cores compute at, the collectives, the head groups, the expert mapping, the attention mode, the
MoE routing). ``handover_bytes`` is the one owner of what a hand-over carries; ``token_cost``
what one token books alone at a stage (its cycles schedule the decode, its link bytes draw the heatmap).

``head_groups`` (G, default 1) models a layout the emulator does not run yet: the region's rows are cut
in G groups, each holding n_kv_heads/G K/V heads with their query heads and head_dim split over its
rows/G rows, so the attention reduces over rows/G rows and a layer region may have up to
``n_kv_heads * head_dim / 2`` rows (WaferLLM's wafer-scale regions need that). G = 1 is the emulated
layout exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, broadcast_cost, compute_cost, message_cycles, on_lines, total
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .decoding import ELEMENTWISE_FLOPS, Decoding, block_ffn_parts
from .routed_cost import moe_parts
from .stage import Entry, Stage, StageKind
from .topk import TopKRow, topk_cost

PREDICT_DTYPE = "float16"  # sparse attention's prediction: 8-bit exponents added to a 16-bit query

# what each part of a layer is, for the breakdown
CATEGORIES = ("gemv", "allreduce", "attention", "elementwise", "handover", "alltoall")


def handover_bytes(config: LlamaConfig, items: int) -> int:
    """Bytes a hand-over between two stages carries: the float32 residual stream (dim) of `items` tokens."""
    return 4 * config.dim * items


def layer_dims(config: LlamaConfig, cols: int, rows: int, head_groups: int = 1) -> dict[str, int]:
    """Per-core extents of a layer region's blocks (the first core's, the largest): dim_c, hid_r, hd_r
    (head_dim in whole RoPE pairs over a head group's rows), hq / hk (query / K/V heads per core)."""
    if head_groups < 1 or config.n_kv_heads % head_groups or rows % head_groups:
        raise ValueError(f"head_groups {head_groups} must divide n_kv_heads {config.n_kv_heads} and the region's "
                         f"{rows} rows")
    r = rows // head_groups
    return {"dim_c": cdiv(config.dim, cols), "hid_r": cdiv(config.dense_hidden, rows),
            "hd_r": 2 * cdiv(config.head_dim // 2, r), "hq": config.n_heads // head_groups,
            "hk": config.n_kv_heads // head_groups, "group_rows": r}


def layer_decode_parts(spec: HardwareSpec, dec: Decoding, region: Region, kv_tokens: int, batch: int = 1,
                       moving: int | None = None) -> list[tuple[str, str, Cost]]:
    """(name, category, Cost) of every piece a layer region books for one micro-batch of `batch` distinct
    requests, in the order the tiles run them (LayerShard.forward)."""
    config, rows, cols, b = dec.config, region.h, region.w, batch
    d = layer_dims(config, cols, rows, dec.head_groups)
    dim_c, hd_r, hq, hk, r = d["dim_c"], d["hd_r"], d["hq"], d["hk"], d["group_rows"]
    cap = cdiv(kv_tokens, cols)
    moving = cols - 1 if moving is None else moving
    ew = ELEMENTWISE_FLOPS

    def flops(n: int) -> Cost:
        return dec.flops(spec, n)

    def x_reduce(nbytes: int) -> Cost:  # along every row of cores (over the columns)
        return dec.line_reduce(spec, "x", cols, nbytes, rows)

    def y_reduce(nbytes: int, n: int = rows) -> Cost:  # along every column of cores (or a head group's rows)
        return dec.line_reduce(spec, "y", n, nbytes, cols * (rows // n))

    norm = [("norm.reduce", "allreduce", x_reduce(4 * b)), ("norm", "elementwise", flops(ew["rmsnorm"] * b * dim_c))]
    qkv_out = (hq + 2 * hk) * hd_r
    parts = norm + [
        ("qkv", "gemv", flops(2 * b * dim_c * qkv_out)), ("qkv.reduce", "allreduce", x_reduce(4 * b * qkv_out)),
        ("rope", "elementwise", flops(ew["rope"] * b * (hq + hk) * hd_r)),
        ("kv.shift", "attention", _kv_shift(spec, b * 2 * hk * (hd_r + 1) * 4, moving * rows)),
    ]
    keep = dec.attention.keys_kept(kv_tokens)
    if keep < kv_tokens:  # sparse: predict every position, keep the row's top K, attend over those
        parts += sparse_parts(spec, dec, region, TopKRow(cols, cap, b * hq, keep))
        cap = min(keep, cap)  # the kept keys a core may hold: the busiest core's bound, as both paths book
    parts += [
        ("scores", "attention", flops(2 * b * hq * hd_r * cap)),
        ("scores.reduce", "attention", y_reduce(4 * b * hq * cap, r)),
        ("softmax.max", "attention", x_reduce(4 * b * hq)), ("softmax.sum", "attention", x_reduce(4 * b * hq)),
        ("softmax", "attention", flops(ew["softmax"] * b * hq * cap)),
        ("attn_v", "attention", flops(2 * b * hq * hd_r * cap)),
        ("attn_v.reduce", "attention", x_reduce(4 * b * hq * hd_r)),
        ("wo", "gemv", flops(2 * b * hq * hd_r * dim_c)), ("wo.reduce", "allreduce", y_reduce(4 * b * dim_c)),
        ("residual", "elementwise", flops(ew["residual"] * b * dim_c)),
    ] + norm
    if config.moe:
        parts += moe_parts(spec, dec, region, b)
    if config.dense_hidden:
        parts += ffn_parts(spec, dec, region, b)
    return parts + [("residual", "elementwise", flops(ew["residual"] * b * dim_c))]


def sparse_parts(spec: HardwareSpec, dec: Decoding, region: Region, row: TopKRow) -> list[tuple[str, str, Cost]]:
    """What sparse attention adds before attending over the kept keys, given the top-K every row of the region
    runs (decode.topk.TopKRow: the region's columns, the `per_core` positions a core holds, the `heads` of every
    token of the micro-batch, the `keep` keys each keeps): the add-only prediction over every held position
    (an exponent add and an add per element, at PREDICT_DTYPE's rate), its partial scores reduced over a head
    group's rows as the scores are, and the row's top-K (decode.topk: every row of the region at once, a row's
    message carrying every token's heads)."""
    if row.cores != region.w:
        raise ValueError(f"the top-K row spans the region's {region.w} columns, got TopKRow.cores {row.cores}")
    d, held, work = layer_dims(dec.config, region.w, region.h, dec.head_groups), row.per_core, row.heads
    r = d["group_rows"]
    return [("predict", "attention", compute_cost(spec, 2 * work * d["hd_r"] * held, PREDICT_DTYPE)),
            ("predict.reduce", "attention", dec.line_reduce(spec, "y", r, 4 * work * held, region.w * (region.h // r)))
            ] + [(name, "attention", on_lines(c, region.h)) for name, c in topk_cost(spec, row).items()]


def attention_parts(spec: HardwareSpec, dec: Decoding, region: Region, kv_tokens: int) -> dict[str, Cost]:
    """One token's attention in a layer region by piece (the "attention" parts of layer_decode_parts, the
    K/V shift left out): for a sparse dec.attention, the prediction, the top-K and the attention over the
    kept keys."""
    out: dict[str, Cost] = {}
    for name, cat, c in layer_decode_parts(spec, dec, region, kv_tokens):
        if cat == "attention" and name != "kv.shift":
            out[name] = out.get(name, Cost()) + c
    return out


def ffn_parts(spec: HardwareSpec, dec: Decoding, region: Region, batch: int) -> list[tuple[str, str, Cost]]:
    """A SwiGLU FFN of dec.config.dense_hidden units (a dense layer's, an MoE's shared expert) as MeshGEMVs
    on `region` for `batch` tokens (LayerShard.forward)."""
    return block_ffn_parts(spec, dec, region.w, region.h, dec.config.dense_hidden, batch)


def _kv_shift(spec: HardwareSpec, nbytes: int, messages: int) -> Cost:
    """The moving columns pass their oldest K/V entry (and its position) one hop east: one routing stage."""
    if messages == 0:
        return Cost()
    return Cost(hops=1, stages=1, link_bytes=messages * nbytes, messages=messages,
                cycles=message_cycles(spec, 1, 1, nbytes))


def layer_decode_cost(spec: HardwareSpec, dec: Decoding, region: Region, kv_tokens: int, batch: int = 1,
                      moving: int | None = None) -> Cost:
    """One micro-batch of `batch` requests through one layer region (see layer_decode_parts)."""
    return total(c for _, _, c in layer_decode_parts(spec, dec, region, kv_tokens, batch, moving))


def head_norm_parts(spec: HardwareSpec, dec: Decoding, region: Region, batch: int) -> list[tuple[str, str, Cost]]:
    """The final RMSNorm of a head region (its sum of squares reduced over the columns)."""
    dim_c = cdiv(dec.config.dim, region.w)
    return [("norm.reduce", "allreduce", dec.line_reduce(spec, "x", region.w, 4 * batch, region.h)),
            ("norm", "elementwise", dec.flops(spec, ELEMENTWISE_FLOPS["rmsnorm"] * batch * dim_c))]


def head_gemv_parts(spec: HardwareSpec, dec: Decoding, region: Region, batch: int,
                    entries: int) -> list[tuple[str, str, Cost]]:
    """The output head's MeshGEMV over `entries` vocabulary entries per core row (all of a row's block, or
    one streamed chunk of it), its partial logits reduced over the columns."""
    dim_c = cdiv(dec.config.dim, region.w)
    return [("head", "gemv", dec.flops(spec, 2 * batch * entries * dim_c)),
            ("head.reduce", "allreduce", dec.line_reduce(spec, "x", region.w, 4 * batch * entries, region.h))]


def head_decode_parts(spec: HardwareSpec, dec: Decoding, region: Region, batch: int = 1
                      ) -> list[tuple[str, str, Cost]]:
    """Final RMSNorm and the output head (vocab x dim) as a MeshGEMV over its region (EmbedShard.logits)."""
    voc_r = cdiv(dec.config.vocab_size, region.h)
    return head_norm_parts(spec, dec, region, batch) + head_gemv_parts(spec, dec, region, batch, voc_r)


def head_decode_cost(spec: HardwareSpec, dec: Decoding, region: Region, batch: int = 1) -> Cost:
    return total(c for _, _, c in head_decode_parts(spec, dec, region, batch))


def handover_cost(spec: HardwareSpec, src: Region, dst: Region, nbytes: int) -> Cost:
    """Activations of nbytes leave src at its border nearest dst and cross the gap (one routing stage of at
    least one hop), then every one of dst's columns multicasts its chunk (nbytes / dst.w) down dst's rows
    (the residual stream is replicated down a region's rows): one stage, dst.w lines of dst.h - 1 hops.
    Between two stages on the same region (layers stacked in one region) nothing moves: the residual
    stream is already split over its columns and replicated down its rows."""
    if src == dst:
        return Cost()
    return _handover(spec, max(src.hops_to(dst), 1), dst.w, dst.h, nbytes)


@lru_cache(maxsize=4096)
def _handover(spec: HardwareSpec, hops: int, cols: int, rows: int, nbytes: int) -> Cost:
    """handover_cost over `hops` into a cols x rows region: the same for every pair of regions that far apart."""
    move = Cost(hops=hops, stages=1, link_bytes=hops * nbytes, messages=1,
                cycles=message_cycles(spec, hops, 1, nbytes))
    if rows == 1:
        return move
    line = broadcast_cost(spec, rows, nbytes / cols)
    return move + Cost(hops=line.hops, stages=1, link_bytes=round((rows - 1) * nbytes),
                       messages=line.messages * cols, cycles=line.cycles)


def stage_handover(spec: HardwareSpec, config: LlamaConfig, src: Region | None, dst: Region, items: int) -> Cost:
    """The hand-over of `items` tokens' activations into a stage on `dst` from one on `src` (None: the first
    stage, nothing moves in)."""
    return Cost() if src is None else handover_cost(spec, src, dst, handover_bytes(config, items))


def step_cycles(spec: HardwareSpec, dec: Decoding, stages: Sequence[Stage], kv_tokens: int,
                batches: Sequence[int], moving: int | None = None) -> dict[tuple[int, int], float]:
    """The cycles every (stage, micro-batch) of a decode step books, as the tiles book them: the embedding
    (the row look-up) books nothing, a layer (layers stacked in one region are consecutive stages on the same
    region) or the head its work; every stage but the first also books the hand-over of the micro-batch's
    activations from the previous stage's region (nothing between two stages on one region)."""
    out: dict[tuple[int, int], float] = {}
    works: dict[tuple[StageKind, int, int, int], float] = {}  # a stage's work by its kind, shape and batch
    sizes = set(batches)
    for s, stage in enumerate(stages):
        prev, region = stages[s - 1].region if s else None, stage.region
        into = {b: stage_handover(spec, dec.config, prev, region, b).cycles for b in sizes}  # once per batch size
        for m, b in enumerate(batches):
            c = into[b]
            if stage.kind is not StageKind.EMBED:
                key = (stage.kind, region.w, region.h, b)
                if key not in works:
                    works[key] = _work(spec, dec, stage.kind, Region(0, 0, region.w, region.h),
                                       Load(kv_tokens, b, moving)).cycles
                c += works[key]
            out[(s, m)] = c
    return out


@lru_cache(maxsize=8192)
def token_cost(spec: HardwareSpec, dec: Decoding, entry: Entry, pos: int, want: bool) -> Cost:
    """What one token at position `pos` books alone entering a stage (decode.stage.Entry: its kind, the
    previous stage's region or None at the embedding, its region), the hand-over into it included: what the
    tiles book for a micro-batch of one. Its attention runs over the pos + 1 positions its request then holds
    (pos % cols columns shift); the head computes logits only for a token that wants them."""
    region = entry.region
    c = stage_handover(spec, dec.config, entry.src, region, 1)
    if entry.kind is StageKind.LAYER or (entry.kind is StageKind.HEAD and want):
        c = c + _work(spec, dec, entry.kind, Region(0, 0, region.w, region.h), Load(pos + 1, 1, pos % region.w))
    return c


def alone_cycles(spec: HardwareSpec, dec: Decoding, entry: Entry, pos: int, want: bool) -> float:
    """The cycles of token_cost: what waferrt.decode.schedule schedules."""
    return token_cost(spec, dec, entry, pos, want).cycles


@dataclass(frozen=True)
class Load:
    """What a stage run works on: its requests' K/V positions (`kv_tokens`), the micro-batch's tokens
    (`batch`), and the columns its K/V shift moves (`moving`; None: all but one)."""

    kv_tokens: int
    batch: int
    moving: int | None = None


@lru_cache(maxsize=4096)
def _work(spec: HardwareSpec, dec: Decoding, kind: StageKind, shape: Region, load: Load) -> Cost:
    """One layer (or the head) on a region of `shape` at (0, 0): the same for every region of that shape."""
    if kind is StageKind.LAYER:
        return layer_decode_cost(spec, dec, shape, load.kv_tokens, load.batch, load.moving)
    return head_decode_cost(spec, dec, shape, load.batch)


def lane_batches(requests: int, lanes: int = 2) -> list[int]:
    """Micro-batch sizes of `requests` decoding in `lanes` lanes (slot mod lanes, as the head's engine
    assigns them): the micro-batches a steady decode step carries."""
    return [len(range(lane, requests, lanes)) for lane in range(min(lanes, requests))]
