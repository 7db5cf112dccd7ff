"""NI-Balancer (MoEntwine): the routing histogram finds a hot block of experts; swapping two experts evens
the blocks' loads; the swap's weights move in steps while decoding goes on, or at once (a stall).

Contract (pure): :func:`block_loads` sums a routing histogram (tokens per expert, MoELayerShard.routed) per
block; :func:`plan_swap` picks the exchange of two experts between blocks of the same shape (their packed
weights fit either block as they are) that lowers the busiest block's load most (None: nothing helps).
:func:`swap_load` is the swap's traffic: every core of either block sends its share of its expert (the
most a core holds, ``per_core`` bytes) to the same core of the other block, x then y, one hop at a time.
Moved at once, the decode stalls for it (:func:`at_once_cost`, the all-to-all cost of that load). Moved by
NI-Balancer (MoEntwine), it goes in ``steps`` equal parts, one per decode step, each link's bytes during
the phase of that step (the attention's or the MoE's) that leaves the link cold -- ER-Mapping makes the two
phases' hot links complementary -- (:func:`step_cost`): over cold links it costs no time; on a link every
phase uses, the part's bytes wait behind it (its busiest such link's bytes over the link bandwidth).
Tokens stay identical: the experts compute where they are until the last part has arrived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from waferrt.core.cost import Cost, alltoall_cost, serialise_cycles
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec

from .linkload import LinkLoad


@dataclass(frozen=True)
class Swap:
    """Experts a and b exchange their blocks."""

    a: int
    b: int

    def __post_init__(self) -> None:
        if self.a == self.b or min(self.a, self.b) < 0:
            raise ValueError(f"a swap exchanges two different experts, got {self.a} and {self.b}")


def block_loads(routed: np.ndarray, blocks: tuple[Region, ...]) -> dict[Region, int]:
    """Tokens the experts of every block received."""
    out = dict.fromkeys(blocks, 0)
    for e, n in enumerate(np.asarray(routed).tolist()):
        out[blocks[e]] += n
    return out


def plan_swap(routed: np.ndarray, blocks: tuple[Region, ...]) -> Swap | None:
    """The swap between same-shaped blocks that lowers the busiest block's load most (None: none does)."""
    best, most = None, max(block_loads(routed, blocks).values())
    for a, b in combinations(range(len(blocks)), 2):
        if blocks[a] == blocks[b] or (blocks[a].w, blocks[a].h) != (blocks[b].w, blocks[b].h):
            continue
        moved = list(blocks)
        moved[a], moved[b] = blocks[b], blocks[a]
        load = max(block_loads(routed, tuple(moved)).values())
        if load < most:
            best, most = Swap(a, b), load
    return best


def swap_load(region: Region, a: Region, b: Region, per_core: float) -> LinkLoad:
    """Both blocks' experts crossing over: core (i, j) of a <-> core (i, j) of b, x then y."""
    load = LinkLoad(region)
    for src, dst in ((a, b), (b, a)):
        for j in range(src.h):
            for i in range(src.w):
                x0, y0 = src.x0 - region.x0 + i, src.y0 - region.y0 + j
                x1, y1 = dst.x0 - region.x0 + i, dst.y0 - region.y0 + j
                load.along_row(y0, x0, x1, per_core)
                load.along_column(x1, y0, y1, per_core)
                load.messages -= (x0 != x1) and (y0 != y1)  # one message, turning once
    return load


def at_once_cost(spec: HardwareSpec, load: LinkLoad) -> Cost:
    """The swap in one go: the decode waits for it."""
    return alltoall_cost(spec, load)


def step_cost(spec: HardwareSpec, load: LinkLoad, steps: int, phases: Sequence[LinkLoad]) -> Cost:
    """One of `steps` equal parts of the swap during a micro-batch whose phases' traffic is `phases` (see the
    module docstring): each link's bytes of the part travel during a phase that leaves that link cold; the
    time it adds is its bytes on its busiest link that every phase uses."""
    part = load.bytes / steps
    hot = np.logical_and.reduce([busy.bytes > 0 for busy in phases])
    shared = float((part * hot).max(initial=0.0))
    return Cost(link_bytes=int(round(part.sum())), messages=int(np.ceil(load.messages / steps)),
                cycles=serialise_cycles(spec, shared))
