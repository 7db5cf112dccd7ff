"""The attention's link traffic on paper: its collectives laid on the links of its region.

Contract: :func:`attention_load` lays the attention phase's collectives -- the closed forms the tiles book
(waferrt.decode.cost.layer_decode_parts, tied to the ledger in tests) -- onto the links: each allreduce
(both norms' too) of the K-tree along its lines (``fabric.line_links.allreduce_links``: the reduce chains
toward each group's centred root, then the multicast both ways), the K/V shift east over the moving
columns, each scaled to the part's booked link bytes. What a run records (waferrt.decode.linkload.
PhaseLinks, the "attention" phase) equals it link for link (tests/unit/test_moe_links.py).
"""

from __future__ import annotations

from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.fabric.comm import Collectives
from waferrt.fabric.line_links import allreduce_links
from waferrt.model.config import LlamaConfig

from .cost import layer_decode_parts
from .decoding import Decoding
from .linkload import E, LinkLoad, N, S, W

ATTENTION_AXES = {"norm.reduce": "x", "qkv.reduce": "x", "scores.reduce": "y", "softmax.max": "x",
                  "softmax.sum": "x", "attn_v.reduce": "x", "wo.reduce": "y"}  # layer_decode_parts' allreduces


def attention_load(spec: HardwareSpec, config: LlamaConfig, region: Region, kv_tokens: int, k: int = 2,
                   moving: int | None = None) -> LinkLoad:
    """The attention phase's link traffic for one token (K-tree allreduces, both norms; the K/V shift over
    `moving` columns, layer_decode_parts' default when None; see the module docstring)."""
    load = LinkLoad(region)
    parts = layer_decode_parts(spec, Decoding(config, coll=Collectives("ktree", k)), region, kv_tokens, 1, moving)
    for name, _, cost in parts:
        if name == "kv.shift" and cost.link_bytes:
            cols = region.w - 1 if moving is None else moving  # columns 0..cols-1 pass an entry east
            load.bytes[E, :, :cols] += cost.link_bytes / (cols * region.h)
        elif name in ATTENTION_AXES and cost.link_bytes:
            axis = ATTENTION_AXES[name]
            n = region.w if axis == "x" else region.h
            lower, higher = allreduce_links("ktree", n, k)[0]
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
