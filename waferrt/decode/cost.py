"""The decode's cost on the modelled wafer: a layer, the head, the hand-over between regions, a pipelined step.

Contract: pure closed forms built from waferrt.core.cost's primitives. ``layer_decode_cost`` and
``embed_decode_cost`` give one token of one request through a layer region / the head; ``handover_cost``
is what the tiles book when activations move from one stage's region to the next (the one formula for
it); ``flow_seconds`` schedules the stage runs that the tiles booked as the wafer would run them. The
scheduler predicts a placement's speed with these; the tiles book with them.
"""

from __future__ import annotations

from waferrt.core.arith import cdiv
from waferrt.core.cost import (
    Cost,
    allreduce_cost,
    broadcast_cost,
    compute_cost,
    gemv_cost,
    message_cycles,
    shift_cost,
)
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig


def layer_decode_cost(spec: HardwareSpec, cfg: LlamaConfig, region: Region, tokens: int) -> Cost:
    """One decode step of one layer for one request with `tokens` cached positions, in its region."""
    rows, cols = region.h, region.w
    dim_c, hid_r = cdiv(cfg.dim, cols), cdiv(cfg.hidden_dim, rows)
    hd_r = 2 * cdiv(cfg.head_dim // 2, rows)
    pos_c = cdiv(max(tokens, 1), cols)
    norm = compute_cost(spec, 2 * dim_c) + allreduce_cost(spec, "ktree", cols, 4)
    qkv = gemv_cost(spec, (cfg.n_heads + 2 * cfg.n_kv_heads) * hd_r, dim_c, cols)
    kv_in = shift_cost(spec, cols, 2 * cfg.n_kv_heads * hd_r * 4, wrap=False)
    scores = compute_cost(spec, 2 * cfg.n_heads * hd_r * pos_c) + allreduce_cost(
        spec, "ktree", rows, 4 * cfg.n_heads * pos_c)
    softmax = allreduce_cost(spec, "ktree", cols, 4 * cfg.n_heads).scaled(2) + compute_cost(
        spec, 3 * cfg.n_heads * pos_c)
    attn_v = compute_cost(spec, 2 * cfg.n_heads * hd_r * pos_c) + allreduce_cost(
        spec, "ktree", cols, 4 * cfg.n_heads * hd_r)
    wo = gemv_cost(spec, dim_c, cfg.n_heads * hd_r, rows)
    ffn_in = gemv_cost(spec, 2 * hid_r, dim_c, cols)
    down = gemv_cost(spec, dim_c, hid_r, rows)
    return norm.scaled(2) + qkv + kv_in + scores + softmax + attn_v + wo + ffn_in + down


def embed_decode_cost(spec: HardwareSpec, cfg: LlamaConfig, region: Region) -> Cost:
    """Final norm + the tied output head (vocab x dim) as a MeshGEMV over the embedding region."""
    rows, cols = region.h, region.w
    dim_c, voc_r = cdiv(cfg.dim, cols), cdiv(cfg.vocab_size, rows)
    norm = compute_cost(spec, 2 * dim_c) + allreduce_cost(spec, "ktree", cols, 4)
    return norm + gemv_cost(spec, voc_r, dim_c, cols)


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
