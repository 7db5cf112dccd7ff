"""The attention's link traffic: its collectives laid on the links of its region (for benchmarks/moe.py).

Contract: :func:`attention_load` lays the attention's collectives -- the closed forms the tiles book
(waferrt.decode.cost.layer_decode_parts, tied to the ledger in tests) -- onto the links: each allreduce of
the K-tree along its lines (``linkload.ktree_line``: the reduce chains toward each group's centred root,
then the multicast both ways), the K/V shift east over the moving columns, each scaled to the part's booked link
bytes.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.fabric.comm import Collectives
from waferrt.model.config import LlamaConfig

from .cost import Decoding, layer_decode_parts
from .linkload import E, LinkLoad, N, S, W, ktree_line

ATTENTION_AXES = {"norm.reduce": "x", "qkv.reduce": "x", "scores.reduce": "y", "softmax.max": "x",
                  "softmax.sum": "x", "attn_v.reduce": "x", "wo.reduce": "y"}  # layer_decode_parts' allreduces


def attention_load(spec: HardwareSpec, config: LlamaConfig, region: Region, kv_tokens: int, k: int = 2) -> LinkLoad:
    """The attention's link traffic for one token (K-tree allreduces; see the module docstring)."""
    load = LinkLoad(region)
    parts = layer_decode_parts(spec, Decoding(config, coll=Collectives("ktree", k)), region, kv_tokens, 1)
    attention = parts[: next(i for i, p in enumerate(parts) if p[0] == "residual") + 1]
    for name, _, cost in attention:
        if name == "kv.shift" and cost.link_bytes:
            moving = np.zeros((region.h, region.w))
            moving[:, : region.w - 1] = 1  # the columns that pass an entry east (at most every one but the last)
            load.bytes[E] += moving * cost.link_bytes / moving.sum()
        elif name in ATTENTION_AXES and cost.link_bytes:
            axis = ATTENTION_AXES[name]
            n = region.w if axis == "x" else region.h
            lower, higher = ktree_line(n, k)
            unit = (lower.sum() + higher.sum()) * (region.h if axis == "x" else region.w)
            scale = cost.link_bytes / unit
            if axis == "x":
                load.bytes[W] += lower[None, :] * scale
                load.bytes[E] += higher[None, :] * scale
            else:
                load.bytes[N] += lower[:, None] * scale
                load.bytes[S] += higher[:, None] * scale
            load.messages += cost.messages
            load.hops = max(load.hops, cost.hops)
    return load
