"""The traffic of every link of a region in one phase of a layer, and what that phase costs.

Contract: a :class:`LinkLoad` holds the bytes that left every core of a region by each of its four sides
(messages routed one hop at a time add to every link on their way); :func:`alltoall_cost` is what a phase
whose messages travel at once costs (the longest route's hops, then the busiest link's bytes one after the
other). The MoE's dispatch and combine book theirs as they run (waferrt.decode.moe). :func:`attention_load`
lays the attention's collectives -- the closed forms the tiles book (waferrt.decode.cost.layer_decode_parts,
tied to the ledger in tests) -- onto the links: each allreduce of the K-tree along its lines (the reduce
chains of ``ktree_levels`` toward each group's first core, then the multicast back out), the K/V shift
east over the moving columns, each scaled to the part's booked link bytes.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.cost import Cost, ktree_levels, message_cycles
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .cost import layer_decode_parts

E, W, S, N = range(4)  # the side a link leaves its core by (LinkLoad.bytes' first axis)
SIDES = "EWSN"


class LinkLoad:
    """Bytes over every directed link of a region: ``bytes[side, y, x]`` is what left core (x, y) (region
    coordinates) by `side`; ``messages`` the messages sent; ``hops`` the longest route's hops."""

    def __init__(self, region: Region):
        self.region = region
        self.bytes = np.zeros((4, region.h, region.w))
        self.messages, self.hops = 0, 0

    def along_row(self, y: int, x0: int, x1: int, nbytes: float) -> None:
        """A message of `nbytes` from (x0, y) to (x1, y), one hop at a time."""
        if x1 > x0:
            self.bytes[E, y, x0:x1] += nbytes
        elif x1 < x0:
            self.bytes[W, y, x1 + 1:x0 + 1] += nbytes
        self.messages += x0 != x1
        self.hops = max(self.hops, abs(x1 - x0))

    def add(self, other: LinkLoad, times: int = 1) -> None:
        if times:
            self.bytes += times * other.bytes
            self.messages += times * other.messages
            self.hops = max(self.hops, other.hops)

    def links(self) -> np.ndarray:
        """The bytes of every link that exists (a region's edge cores have no link out of it)."""
        b = self.bytes
        return np.concatenate([b[E, :, :-1].ravel(), b[W, :, 1:].ravel(), b[S, :-1].ravel(), b[N, 1:].ravel()])

    def hottest(self) -> float:
        return float(self.links().max(initial=0.0))

    def cold_share(self) -> float:
        """The share of the region's links that carried nothing."""
        links = self.links()
        return float(np.mean(links == 0)) if links.size else 1.0

    def total(self) -> float:
        return float(self.bytes.sum())


def alltoall_cost(spec: HardwareSpec, load: LinkLoad) -> Cost:
    """A phase whose messages all travel at once: the longest route's hops, then the busiest link's bytes
    one after the other (one routing stage)."""
    if not load.messages:
        return Cost()
    return Cost(hops=load.hops, stages=1, link_bytes=int(round(load.total())), messages=load.messages,
                cycles=message_cycles(spec, load.hops, 1, load.hottest()))


ATTENTION_AXES = {"norm.reduce": "x", "qkv.reduce": "x", "scores.reduce": "y", "softmax.max": "x",
                  "softmax.sum": "x", "attn_v.reduce": "x", "wo.reduce": "y"}  # layer_decode_parts' allreduces


def ktree_line(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Messages over each link of a line of n cores in one K-tree allreduce: (toward the root, away from it),
    each (n,) indexed by the core the link leaves."""
    back, out = np.zeros(n), np.zeros(n)
    for stride, chain in ktree_levels(n, k):
        span = stride * (chain + 1)
        for t in range(1, chain + 1):
            for src in range(t * stride, n, span):
                back[src - stride + 1: src + 1] += 1  # member t hands its partial sum stride hops back
    out[: n - 1] = 1  # the root's multicast passes every link once
    return back, out


def attention_load(spec: HardwareSpec, cfg: LlamaConfig, region: Region, kv_tokens: int, k: int = 2) -> LinkLoad:
    """The attention's link traffic for one token (K-tree allreduces; see the module docstring)."""
    load = LinkLoad(region)
    parts = layer_decode_parts(spec, cfg, region, kv_tokens, 1, algo="ktree", k=k)
    attention = parts[: next(i for i, p in enumerate(parts) if p[0] == "residual") + 1]
    for name, _, cost in attention:
        if name == "kv.shift" and cost.link_bytes:
            moving = np.zeros((region.h, region.w))
            moving[:, : region.w - 1] = 1  # the columns that pass an entry east (at most every one but the last)
            load.bytes[E] += moving * cost.link_bytes / moving.sum()
        elif name in ATTENTION_AXES and cost.link_bytes:
            axis = ATTENTION_AXES[name]
            n = region.w if axis == "x" else region.h
            back, out = ktree_line(n, k)
            unit = (back.sum() + out.sum()) * (region.h if axis == "x" else region.w)
            scale = cost.link_bytes / unit
            if axis == "x":
                load.bytes[W] += back[None, :] * scale
                load.bytes[E] += out[None, :] * scale
            else:
                load.bytes[N] += back[:, None] * scale
                load.bytes[S] += out[:, None] * scale
            load.messages += cost.messages
            load.hops = max(load.hops, cost.hops)
    return load
