"""Which links of a line a collective's messages cross: the patterns of fabric.comm's algorithms.

Contract (pure): every function returns messages per link of a line of n cores as (toward lower positions,
toward higher), each (n,) indexed by the core the link leaves (a line's end has no link out of it).
:func:`line_links` is chosen cores sending one message `dist` hops, :func:`multicast_links` a multicast
from a root, :func:`allreduce_links` a whole allreduce of each algorithm as the hop-by-hop LineComm sends
it (tested equal, link for link, in tests/unit/test_moe_links.py); :func:`folded_ring` is the ring the
"ring" algorithm runs on. LineComm's link taps lay these on a region's links (waferrt.decode.linkload).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from waferrt.core.cost import tree_plan
from waferrt.core.topology import MESH


def line_links(n: int, src, dist: int) -> tuple[np.ndarray, np.ndarray]:
    """Messages over each link of a line of n cores when the cores at `src` each send one `dist` hops along it:
    (toward lower positions, toward higher), each (n,) indexed by the core the link leaves."""
    src = np.asarray(src, np.int64).reshape(-1)
    edges = np.zeros(n + 1)
    lo = src if dist > 0 else src + dist + 1
    np.add.at(edges, lo, 1)
    np.add.at(edges, lo + abs(dist), -1)
    moves = np.cumsum(edges[:n])
    zero = np.zeros(n)
    return (zero, moves) if dist > 0 else (moves, zero)


def multicast_links(n: int, root: int) -> tuple[np.ndarray, np.ndarray]:
    """A multicast from `root` passes every link of the line once, away from it (as line_links)."""
    lower, higher = np.zeros(n), np.zeros(n)
    higher[root:n - 1] = 1
    lower[1:root + 1] = 1
    return lower, higher


def folded_ring(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The folded ring of a line (evens going out, odds coming back: ring neighbours at most 2 hops apart):
    (each position's place on the ring, each position's successor)."""
    order = list(MESH.ring_order(n))  # the owner of a ring's order (core.topology)
    ring_index = np.empty(n, np.int64)
    ring_index[order] = np.arange(n)
    return ring_index, np.array(order[1:] + order[:1])[ring_index]


@lru_cache(maxsize=4096)
def allreduce_links(algo: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Messages over each link of a line of n cores in one `algo` allreduce, as the hop-by-hop algorithm
    sends them: (whole-vector messages, segment messages) of shape (2, n) each -- [toward lower, toward
    higher] -- a segment being one of the n padded pieces ring and pipeline cut the vector into."""
    whole, seg = np.zeros((2, n)), np.zeros((2, n))
    if n == 1:
        return whole, seg
    if algo in ("ktree", "chain"):
        plan = tree_plan(algo, n, k)
        for step in (step for level in plan.levels for step in level.steps):
            for d, srcs in step:
                whole += line_links(n, srcs, d)
        whole += multicast_links(n, plan.root)
    elif algo == "ring":
        _, succ = folded_ring(n)
        for p in range(n):
            seg += 2 * (n - 1) * np.array(line_links(n, [p], int(succ[p] - p)))
    else:  # pipeline: every core but the first passes each of the n segments one hop down, then a multicast
        seg += n * np.array(line_links(n, np.arange(1, n), -1))
        whole += multicast_links(n, 0)
    return whole, seg
