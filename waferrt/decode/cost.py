"""The decode's cost on the modelled wafer: a layer, the head, the hand-over between regions, a decode step.

Contract: pure closed forms built from waferrt.core.cost's primitives, equal to what the emulator books
(tests/unit/test_estimate_emulator.py runs the tiles and compares hops, stages, messages, link bytes,
flops and cycles). ``layer_decode_parts`` / ``layer_decode_cost`` give one micro-batch of ``batch``
requests through one layer region (every booked piece, named, with its category), ``head_decode_cost``
the final norm and output head, ``handover_cost`` what the tiles book when activations move from one
stage's region to the next (the one formula for it), ``step_cycles`` the (stage, micro-batch) cycles a
whole decode step books in lock step and ``pipeline_seconds`` schedules them (the weight-streaming
estimate's step model), ``alone_cycles`` what one token takes alone at a stage (waferrt.decode.schedule
schedules the decode that ran with it: every request at its own pace).

What the closed forms count, as the tiles do: the attention runs over ``cdiv(kv_tokens, cols)`` positions
per core (``kv_tokens``: the context the fullest request of the micro-batch holds, the new token
included; the planner times a full K/V reserve); the new K/V enter at column 0 and ``moving`` columns
pass their oldest entry one hop east (``pos % cols`` for a request at position ``pos``; the default, the
most, ``cols - 1``); messages and link bytes count every parallel line of the region; element-wise work
(RMSNorm, RoPE, softmax, SiLU, residual adds) is booked at ``ELEMENTWISE_FLOPS`` per element.

``head_groups`` (G, default 1) models a layout the emulator does not run yet: the region's rows are cut
in G groups, each holding n_kv_heads/G K/V heads with their query heads and head_dim split over its
rows/G rows, so the attention reduces over rows/G rows and a layer region may have up to
``n_kv_heads * head_dim / 2`` rows (WaferLLM's wafer-scale regions need that). G = 1 is the emulated
layout exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, allreduce_cost, broadcast_cost, message_cycles, total
from waferrt.core.ledger import merge_parallel
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .linkload import AllToAll, alltoall_cost
from .moe_layout import expert_blocks

# flops per element of the element-wise work, as the tiles book it (exp counted as one flop):
# RMSNorm x*x, sum, *scale, *w; RoPE 4 mul + 2 add per pair; softmax *scale, max, -max, exp, sum, /sum;
# SiLU(g)*u as -g, exp, +1, /, *u; a residual add.
ELEMENTWISE_FLOPS = {"rmsnorm": 4, "rope": 3, "softmax": 6, "silu_mul": 5, "residual": 1}

# what each part of a layer is, for the breakdown
CATEGORIES = ("gemv", "allreduce", "attention", "elementwise", "handover", "alltoall")


def on_lines(c: Cost, lines: int) -> Cost:
    """The same collective run on `lines` parallel lines at once: the critical path is one line's, the
    traffic (messages, link bytes) is every line's -- what the tiles book."""
    return Cost(hops=c.hops, stages=c.stages, link_bytes=c.link_bytes * lines, messages=c.messages * lines,
                flops=c.flops, cycles=c.cycles)


def _flops(spec: HardwareSpec, flops: int) -> Cost:
    return Cost(flops=int(flops), cycles=flops / spec.flops_per_cycle)


def layer_dims(cfg: LlamaConfig, cols: int, rows: int, head_groups: int = 1) -> dict[str, int]:
    """Per-core extents of a layer region's blocks (the first core's, the largest): dim_c, hid_r, hd_r
    (head_dim in whole RoPE pairs over a head group's rows), hq / hk (query / K/V heads per core)."""
    if head_groups < 1 or cfg.n_kv_heads % head_groups or rows % head_groups:
        raise ValueError(f"head_groups {head_groups} must divide n_kv_heads {cfg.n_kv_heads} and the region's "
                         f"{rows} rows")
    r = rows // head_groups
    return {"dim_c": cdiv(cfg.dim, cols), "hid_r": cdiv(cfg.dense_hidden, rows),
            "hd_r": 2 * cdiv(cfg.head_dim // 2, r), "hq": cfg.n_heads // head_groups,
            "hk": cfg.n_kv_heads // head_groups, "group_rows": r}


def layer_decode_parts(spec: HardwareSpec, cfg: LlamaConfig, region: Region, kv_tokens: int, batch: int = 1, *,
                       moving: int | None = None, algo: str = "ktree", k: int = 2,
                       head_groups: int = 1) -> list[tuple[str, str, Cost]]:
    """(name, category, Cost) of every piece a layer region books for one micro-batch of `batch` distinct
    requests, in the order the tiles run them (LayerShard.forward)."""
    rows, cols, b = region.h, region.w, batch
    d = layer_dims(cfg, cols, rows, head_groups)
    dim_c, hid_r, hd_r, hq, hk, r = d["dim_c"], d["hid_r"], d["hd_r"], d["hq"], d["hk"], d["group_rows"]
    cap = cdiv(kv_tokens, cols)
    moving = cols - 1 if moving is None else moving
    ew = ELEMENTWISE_FLOPS

    def x_reduce(nbytes: int) -> Cost:  # along every row of cores (over the columns)
        return on_lines(allreduce_cost(spec, algo, cols, nbytes, k), rows)

    def y_reduce(nbytes: int, n: int = rows) -> Cost:  # along every column of cores (or a head group's rows)
        return on_lines(allreduce_cost(spec, algo, n, nbytes, k), cols * (rows // n))

    norm = [("norm.reduce", "allreduce", x_reduce(4 * b)),
            ("norm", "elementwise", _flops(spec, ew["rmsnorm"] * b * dim_c))]
    qkv_out = (hq + 2 * hk) * hd_r
    parts = norm + [
        ("qkv", "gemv", _flops(spec, 2 * b * dim_c * qkv_out)), ("qkv.reduce", "allreduce", x_reduce(4 * b * qkv_out)),
        ("rope", "elementwise", _flops(spec, ew["rope"] * b * (hq + hk) * hd_r)),
        ("kv.shift", "attention", _kv_shift(spec, b * 2 * hk * (hd_r + 1) * 4, moving * rows)),
        ("scores", "attention", _flops(spec, 2 * b * hq * hd_r * cap)),
        ("scores.reduce", "attention", y_reduce(4 * b * hq * cap, r)),
        ("softmax.max", "attention", x_reduce(4 * b * hq)), ("softmax.sum", "attention", x_reduce(4 * b * hq)),
        ("softmax", "attention", _flops(spec, ew["softmax"] * b * hq * cap)),
        ("attn_v", "attention", _flops(spec, 2 * b * hq * hd_r * cap)),
        ("attn_v.reduce", "attention", x_reduce(4 * b * hq * hd_r)),
        ("wo", "gemv", _flops(spec, 2 * b * hq * hd_r * dim_c)), ("wo.reduce", "allreduce", y_reduce(4 * b * dim_c)),
        ("residual", "elementwise", _flops(spec, ew["residual"] * b * dim_c)),
    ] + norm
    if cfg.moe:
        parts += moe_parts(spec, cfg, region, b, algo, k)
    if cfg.dense_hidden:
        parts += [
            ("ffn_in", "gemv", _flops(spec, 2 * b * dim_c * 2 * hid_r)),
            ("ffn_in.reduce", "allreduce", x_reduce(4 * b * 2 * hid_r)),
            ("silu_mul", "elementwise", _flops(spec, ew["silu_mul"] * b * hid_r)),
            ("down", "gemv", _flops(spec, 2 * b * hid_r * dim_c)), ("down.reduce", "allreduce", y_reduce(4 * b * dim_c)),
        ]
    return parts + [("residual", "elementwise", _flops(spec, ew["residual"] * b * dim_c))]


def moe_parts(spec: HardwareSpec, cfg: LlamaConfig, region: Region, batch: int, algo: str = "ktree",
              k: int = 2) -> list[tuple[str, str, Cost]]:
    """An MoE FFN's pieces for `batch` tokens that each chose experts 0..top_k-1 (what a zero router picks:
    the closed forms' typical token) on the ER-Mapping (the decode's default, waferrt.decode.moe_layout):
    the router, the experts in their blocks side by side, the dispatch and the combine (the routes the tiles
    book, waferrt.decode.linkload.AllToAll)."""
    return list(_moe_parts(spec, cfg, region.w, region.h, batch, (algo, k)))


@lru_cache(maxsize=4096)
def _moe_parts(spec: HardwareSpec, cfg: LlamaConfig, cols: int, rows: int, batch: int, coll: tuple[str, int]) -> tuple:
    """moe_parts on a cols x rows region (the same for every region of that shape)."""
    (algo, k), region = coll, Region(0, 0, cols, rows)
    e, b, dim_c = cfg.n_experts, batch, cdiv(cfg.dim, region.w)
    blocks = expert_blocks(e, region, "er")
    chosen = np.tile(np.arange(cfg.top_k), (b, 1))  # (b, top_k)
    per_block: dict[Region, Cost] = {}
    for ex in range(cfg.top_k):
        per_block[blocks[ex]] = per_block.get(blocks[ex], Cost()) + _expert_cost(spec, cfg, blocks[ex], b, (algo, k))
    dispatch, combine = AllToAll(cfg.dim, region, blocks).loads(chosen)
    return (("router", "gemv", _flops(spec, 2 * b * dim_c * e)),
            ("router.reduce", "allreduce", on_lines(allreduce_cost(spec, algo, region.w, 4 * b * e, k), region.h)),
            ("experts", "gemv", merge_parallel(list(per_block.values()))),
            ("dispatch", "alltoall", alltoall_cost(spec, dispatch)),
            ("combine", "alltoall", alltoall_cost(spec, combine)))


def _expert_cost(spec: HardwareSpec, cfg: LlamaConfig, block: Region, b: int, coll: tuple[str, int]) -> Cost:
    """One expert's SwiGLU for b tokens as MeshGEMVs in its block (MoELayerShard._expert)."""
    algo, k = coll
    dim_c, hid_r = cdiv(cfg.dim, block.w), cdiv(cfg.hidden_dim, block.h)
    return total([
        _flops(spec, 2 * b * dim_c * 2 * hid_r),
        on_lines(allreduce_cost(spec, algo, block.w, 4 * b * 2 * hid_r, k), block.h),
        _flops(spec, ELEMENTWISE_FLOPS["silu_mul"] * b * hid_r),
        _flops(spec, 2 * b * hid_r * dim_c),
        on_lines(allreduce_cost(spec, algo, block.h, 4 * b * dim_c, k), block.w)])


def _kv_shift(spec: HardwareSpec, nbytes: int, messages: int) -> Cost:
    """The moving columns pass their oldest K/V entry (and its position) one hop east: one routing stage."""
    if messages == 0:
        return Cost()
    return Cost(hops=1, stages=1, link_bytes=messages * nbytes, messages=messages,
                cycles=message_cycles(spec, 1, 1, nbytes))


def layer_decode_cost(spec: HardwareSpec, cfg: LlamaConfig, region: Region, kv_tokens: int, batch: int = 1,
                      **kw) -> Cost:
    """One micro-batch of `batch` requests through one layer region (see layer_decode_parts)."""
    return total(c for _, _, c in layer_decode_parts(spec, cfg, region, kv_tokens, batch, **kw))


def head_decode_parts(spec: HardwareSpec, cfg: LlamaConfig, region: Region, batch: int = 1, *, algo: str = "ktree",
                      k: int = 2) -> list[tuple[str, str, Cost]]:
    """Final RMSNorm and the output head (vocab x dim) as a MeshGEMV over its region (EmbedShard.logits)."""
    rows, cols, b = region.h, region.w, batch
    dim_c, voc_r = cdiv(cfg.dim, cols), cdiv(cfg.vocab_size, rows)

    def x_reduce(nbytes: int) -> Cost:
        return on_lines(allreduce_cost(spec, algo, cols, nbytes, k), rows)

    return [("norm.reduce", "allreduce", x_reduce(4 * b)),
            ("norm", "elementwise", _flops(spec, ELEMENTWISE_FLOPS["rmsnorm"] * b * dim_c)),
            ("head", "gemv", _flops(spec, 2 * b * voc_r * dim_c)),
            ("head.reduce", "allreduce", x_reduce(4 * b * voc_r))]


def head_decode_cost(spec: HardwareSpec, cfg: LlamaConfig, region: Region, batch: int = 1, **kw) -> Cost:
    return total(c for _, _, c in head_decode_parts(spec, cfg, region, batch, **kw))


def handover_cost(spec: HardwareSpec, src: Region, dst: Region, nbytes: int) -> Cost:
    """Activations of nbytes leave src at its border nearest dst and cross the gap (one routing stage of at
    least one hop), then every one of dst's columns multicasts its chunk (nbytes / dst.w) down dst's rows
    (the residual stream is replicated down a region's rows): one stage, dst.w lines of dst.h - 1 hops.
    Between two stages on the same region (layers stacked in one region) nothing moves: the residual
    stream is already split over its columns and replicated down its rows."""
    if src == dst:
        return Cost()
    hops = max(src.hops_to(dst), 1)
    move = Cost(hops=hops, stages=1, link_bytes=hops * nbytes, messages=1,
                cycles=message_cycles(spec, hops, 1, nbytes))
    if dst.h == 1:
        return move
    line = broadcast_cost(spec, dst.h, nbytes / dst.w)
    return move + Cost(hops=line.hops, stages=1, link_bytes=round((dst.h - 1) * nbytes),
                       messages=line.messages * dst.w, cycles=line.cycles)


def step_cycles(spec: HardwareSpec, cfg: LlamaConfig, stages: Sequence[tuple[str, Region]], kv_tokens: int,
                batches: Sequence[int], **kw) -> dict[tuple[int, int], float]:
    """The cycles every (stage, micro-batch) of a decode step books, as the tiles book them: `stages` are
    (kind, region) with kind "embed" (the row look-up: nothing booked), "layer" (one layer; layers stacked in
    one region are consecutive stages on the same region) or "head"; every stage but the first also books
    the hand-over of the micro-batch's activations from the previous stage's region (nothing between two
    stages on one region). `kw` go to layer_decode_parts (moving, algo, k, head_groups)."""
    out: dict[tuple[int, int], float] = {}
    opts = tuple(sorted(kw.items()))
    for s, (kind, region) in enumerate(stages):
        for m, b in enumerate(batches):
            c = handover_cost(spec, stages[s - 1][1], region, 4 * cfg.dim * b).cycles if s else 0.0
            if kind != "embed":
                c += _work_cycles(spec, cfg, kind, region.w, region.h, kv_tokens, b, opts)
            out[(s, m)] = c
    return out


def alone_cycles(spec: HardwareSpec, cfg: LlamaConfig, prev: Region | None, region: Region, kind: str,
                 pos: int, want: bool, algo: str = "ktree", k: int = 2) -> float:
    """The cycles one token at position `pos` takes alone at a stage of `kind` on `region` (coming from
    `prev`, None at the embedding), the hand-over included: what the tiles book for a micro-batch of one.
    Its attention runs over the pos + 1 positions its request then holds; the head computes logits only
    for a token that wants them."""
    c = handover_cost(spec, prev, region, 4 * cfg.dim).cycles if prev is not None else 0.0
    if kind == "layer":
        c += _work_cycles(spec, cfg, kind, region.w, region.h, pos + 1, 1,
                          (("algo", algo), ("k", k), ("moving", pos % region.w)))
    elif kind == "head" and want:
        c += _work_cycles(spec, cfg, kind, region.w, region.h, pos + 1, 1, (("algo", algo), ("k", k)))
    return c


@lru_cache(maxsize=4096)
def _work_cycles(spec: HardwareSpec, cfg: LlamaConfig, kind: str, cols: int, rows: int, kv_tokens: int, b: int,
                 opts: tuple) -> float:
    """Cycles of one layer (or the head) on a cols x rows region: the same for every region of that shape."""
    region, kw = Region(0, 0, cols, rows), dict(opts)
    if kind == "layer":
        return layer_decode_cost(spec, cfg, region, kv_tokens, b, **kw).cycles
    return head_decode_cost(spec, cfg, region, b, **{key: v for key, v in kw.items() if key in ("algo", "k")}).cycles


def pipeline_seconds(cycles: dict, n_stages: int, n_items: int, clock_hz: float) -> float:
    """Modelled time of one step: every stage region is its own hardware and takes the (micro-batches of)
    items in order, so item i leaves stage s at max(it left stage s-1, item i-1 left stage s) + its
    cycles at s. `cycles` maps (stage, item) to cycles (missing: 0)."""
    done_prev = np.zeros(n_items)
    for s in range(n_stages):
        t = 0.0
        for i in range(n_items):
            t = max(t, done_prev[i]) + cycles.get((s, i), 0.0)
            done_prev[i] = t
    return float(done_prev.max(initial=0.0)) / clock_hz


def lane_batches(requests: int, lanes: int = 2) -> list[int]:
    """Micro-batch sizes of `requests` decoding in `lanes` lanes (slot mod lanes, as the head's engine
    assigns them): the micro-batches a steady decode step carries."""
    return [len(range(lane, requests, lanes)) for lane in range(min(lanes, requests))]
