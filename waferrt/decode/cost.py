"""The decode's cost on the modelled wafer: a layer, the head, the hand-over between regions, a pipelined step.

Contract: pure closed forms built from waferrt.core.cost's primitives. ``layer_decode_cost`` and
``embed_decode_cost`` give one token of one request through a layer region / the head; ``handover_cost``
is what the tiles book when activations move from one stage's region to the next (the one formula for
it); ``pipeline_seconds`` schedules the per-(stage, micro-batch) cycles that the tiles booked as the wafer
would run them. The scheduler predicts a placement's speed with these; the tiles book with them.
"""

from __future__ import annotations

import numpy as np

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
