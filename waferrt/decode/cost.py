"""The decode's cost on the modelled wafer: a layer, the head, the hand-over between regions, a decode step.

Contract: pure closed forms built from waferrt.core.cost's primitives, equal to what the emulator books
(tests/unit/test_estimate_emulator.py runs the tiles and compares hops, stages, messages, link bytes,
flops and cycles). ``layer_decode_parts`` / ``layer_decode_cost`` give one micro-batch of ``batch``
requests through one layer region (every booked piece, named, with its category), ``head_decode_cost``
the final norm and output head, ``handover_cost`` what the tiles book when activations move from one
stage's region to the next (the one formula for it), ``step_cycles`` the (stage, micro-batch) cycles a
whole decode step books in lock step and ``pipeline_seconds`` schedules them as the wafer would run them
(the estimator's step model); ``flow_seconds`` schedules the stage runs the tiles' decode loops booked
(what ran: micro-batches at their own pace).

What the closed forms count, as the tiles do: the attention runs over every reserved K/V position of a
core (``cdiv(kv_tokens, cols)``, masked where empty); the new K/V enter at column 0 and ``moving`` columns
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
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, allreduce_cost, broadcast_cost, message_cycles, total
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

# flops per element of the element-wise work, as the tiles book it (exp counted as one flop):
# RMSNorm x*x, sum, *scale, *w; RoPE 4 mul + 2 add per pair; softmax *scale, max, -max, exp, sum, /sum;
# SiLU(g)*u as -g, exp, +1, /, *u; a residual add.
ELEMENTWISE_FLOPS = {"rmsnorm": 4, "rope": 3, "softmax": 6, "silu_mul": 5, "residual": 1}

# what each part of a layer is, for the breakdown
CATEGORIES = ("gemv", "allreduce", "attention", "elementwise", "handover")


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
    return {"dim_c": cdiv(cfg.dim, cols), "hid_r": cdiv(cfg.hidden_dim, rows),
            "hd_r": 2 * cdiv(cfg.head_dim // 2, r), "hq": cfg.n_heads // head_groups,
            "hk": cfg.n_kv_heads // head_groups, "group_rows": r}


@dataclass(frozen=True)
class StageRun:
    """One stage run on one micro-batch, as this tile booked it."""

    mb: int  # micro-batch number
    stage: int
    region: Region  # the hardware that ran it (the embedding and the head share one)
    seq: int  # the order this tile ran it in
    items: int  # tokens in the micro-batch
    cycles: float  # modelled, the hand-over into the region included



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
    ] + norm + [
        ("ffn_in", "gemv", _flops(spec, 2 * b * dim_c * 2 * hid_r)),
        ("ffn_in.reduce", "allreduce", x_reduce(4 * b * 2 * hid_r)),
        ("silu_mul", "elementwise", _flops(spec, ew["silu_mul"] * b * hid_r)),
        ("down", "gemv", _flops(spec, 2 * b * hid_r * dim_c)), ("down.reduce", "allreduce", y_reduce(4 * b * dim_c)),
        ("residual", "elementwise", _flops(spec, ew["residual"] * b * dim_c)),
    ]
    return parts


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
    (the residual stream is replicated down a region's rows): one stage, dst.w lines of dst.h - 1 hops."""
    hops = max(src.hops_to(dst), 1)
    move = Cost(hops=hops, stages=1, link_bytes=hops * nbytes, messages=1,
                cycles=message_cycles(spec, hops, 1, nbytes))
    if dst.h == 1:
        return move
    line = broadcast_cost(spec, dst.h, nbytes / dst.w)
    return move + Cost(hops=line.hops, stages=1, link_bytes=round((dst.h - 1) * nbytes),
                       messages=line.messages * dst.w, cycles=line.cycles)


def flow_seconds(runs, parents: dict[int, int | None], last_stage: int, clock_hz: float) -> float:
    """Modelled time of the decode that ran: every region is its own hardware and runs its stage runs in
    the order its tile ran them; a run of micro-batch m at stage s starts when m left stage s-1 and the
    region is free; at the embedding (s = 0) it starts when its parent (the micro-batch whose sampled
    tokens it carries, ``parents[m]``; None: none) left the head (`last_stage`). `runs` are StageRuns of
    every tile (mb, stage, region, seq, cycles). Returns the time the last run ends, in seconds."""
    queues: dict = {}
    for r in sorted(runs, key=lambda r: r.seq):
        queues.setdefault(r.region, []).append(r)
    done: dict[tuple[int, int], float] = {}
    free = dict.fromkeys(queues, 0.0)
    heads = dict.fromkeys(queues, 0)
    left = len(runs)
    while left:
        progressed = False
        for region, queue in queues.items():
            while heads[region] < len(queue):
                r = queue[heads[region]]
                dep = (r.mb, r.stage - 1) if r.stage else (
                    None if parents.get(r.mb) is None else (parents[r.mb], last_stage))
                if dep is not None and dep not in done:
                    break
                start = max(free[region], 0.0 if dep is None else done[dep])
                done[(r.mb, r.stage)] = free[region] = start + r.cycles
                heads[region] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise ValueError("the stage runs do not form a pipeline: a micro-batch waits for one that never ran")
    return max(done.values(), default=0.0) / clock_hz


def step_cycles(spec: HardwareSpec, cfg: LlamaConfig, stages: Sequence[tuple[str, Region, int]], kv_tokens: int,
                batches: Sequence[int], **kw) -> dict[tuple[int, int], float]:
    """The cycles every (stage, micro-batch) of a decode step books, as the tiles book them: `stages` are
    (kind, region, layers) with kind "embed" (the row look-up: nothing booked), "layer" (`layers` layers
    run back to back in one region, no hand-over between them) or "head" (`layers` ignored); every stage but
    the first also books the hand-over of the micro-batch's activations from the previous stage's region.
    `kw` go to layer_decode_parts (moving, algo, k, head_groups)."""
    out: dict[tuple[int, int], float] = {}
    opts = tuple(sorted(kw.items()))
    for s, (kind, region, layers) in enumerate(stages):
        for m, b in enumerate(batches):
            c = handover_cost(spec, stages[s - 1][1], region, 4 * cfg.dim * b).cycles if s else 0.0
            if kind != "embed":
                times = layers if kind == "layer" else 1
                c += times * _work_cycles(spec, cfg, kind, region.w, region.h, kv_tokens, b, opts)
            out[(s, m)] = c
    return out


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


def round_seconds(runs, parents: dict[int, int | None], last_stage: int, clock_hz: float) -> float:
    """The modelled seconds of the last round of a decode that ran (a round: one more token for every lane):
    flow_seconds of every run, less that of the runs before the last round (each micro-batch's round is how
    many parents it has)."""
    depth: dict[int, int] = {}
    for mb in sorted(parents):
        depth[mb] = 0 if parents[mb] is None else depth[parents[mb]] + 1
    last = max(depth.values())
    before = [r for r in runs if depth[r.mb] < last]
    return (flow_seconds(runs, parents, last_stage, clock_hz)
            - flow_seconds(before, {m: p for m, p in parents.items() if depth[m] < last}, last_stage, clock_hz))


def lanes_round_seconds(cycles: dict[tuple[int, int], float], regions: Sequence, clock_hz: float,
                        rounds: int = 4) -> float:
    """The steady round of the lanes' micro-batches circulating through the stages, as the head's engine
    runs them: lane l's micro-batch of round r+1 enters as soon as its round r left the head. `cycles`
    maps (stage, lane) to the cycles a stage run books; `regions[s]` is stage s's hardware (the
    embedding's and the head's are one). Every region takes the micro-batches in the order they come:
    round by round, lane by lane; the embedding/head region takes a lane's head run, then its next embed.
    Returns round_seconds of `rounds` such rounds."""
    lanes, last = 1 + max(lane for _, lane in cycles), len(regions) - 1
    mb = {(r, lane): r * lanes + lane + 1 for r in range(rounds) for lane in range(lanes)}
    parents = {m: (mb[(r - 1, lane)] if r else None) for (r, lane), m in mb.items()}
    order = {s: [(r, lane) for r in range(rounds) for lane in range(lanes)] for s in range(1, last)}
    head = [(s, (0, lane)) for s in (0,) for lane in range(lanes)]
    for r in range(rounds):
        for lane in range(lanes):
            head += [(last, (r, lane))] + ([(0, (r + 1, lane))] if r + 1 < rounds else [])
    runs = [StageRun(mb[key], s, regions[s], i, 0, cycles[(s, key[1])]) for i, (s, key) in enumerate(head)]
    runs += [StageRun(mb[key], s, regions[s], i, 0, cycles[(s, key[1])])
             for s, keys in order.items() for i, key in enumerate(keys)]
    return round_seconds(runs, parents, last, clock_hz)
