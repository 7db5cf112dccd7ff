"""Which links of a line a collective's messages cross: the patterns of fabric.comm's algorithms.

Contract (pure): every function returns messages per link of a line of n cores as (toward lower positions,
toward higher), each (n,) indexed by the core the link leaves. A mesh line's end has no link out of it; a
torus's wrap link is the end's (``higher[n-1]``: from the last core on to the first; ``lower[0]``: back). The
links a message crosses are its route over the line's topology (``core.topology.Topology.route``, the owner:
the mesh's in closed form here, tested equal); a mesh-switch's switch links are not the line's and are left out.
:func:`line_links` is chosen cores sending one message `dist` hops, :func:`multicast_links` a multicast
from a root, :func:`allreduce_links` a whole allreduce of each algorithm as the hop-by-hop LineComm sends
it (tested equal, link for link, in tests/unit/test_moe_links.py); :func:`ring_successors` is the ring the
"ring" algorithm runs on. LineComm's link taps lay these on a region's links (waferrt.decode.linkload).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from waferrt.core.cost import tree_plan
from waferrt.core.topology import MESH, Topology


def line_links(n: int, src, dist: int, topology: Topology = MESH) -> tuple[np.ndarray, np.ndarray]:
    """Messages over each link of a line of n cores when the cores at `src` each send one `dist` positions along
    it, each by its route over `topology`: (toward lower positions, toward higher), each (n,) indexed by the core
    the link leaves."""
    src = np.asarray(src, np.int64).reshape(-1)
    if topology.kind != "mesh":
        return routes_links(n, [(int(s), int(s) + dist) for s in src], topology)
    edges = np.zeros(n + 1)
    lo = src if dist > 0 else src + dist + 1
    np.add.at(edges, lo, 1)
    np.add.at(edges, lo + abs(dist), -1)
    moves = np.cumsum(edges[:n])
    zero = np.zeros(n)
    return (zero, moves) if dist > 0 else (moves, zero)


def routes_links(n: int, pairs, topology: Topology, once: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Messages over each link of a line of n cores when a message goes from a to b for every (a, b) of `pairs`,
    each by ``topology.route`` (as line_links); `once`: a link the routes share carries the message once (a
    multicast's tree)."""
    links = [link for a, b in pairs for link in topology.route(n, a, b) if isinstance(link[0], int)]
    lower, higher = np.zeros(n), np.zeros(n)
    for p, q in set(links) if once else links:
        side = higher if q == p + 1 or (q == 0 and p == n - 1 and n > 2) else lower  # a torus's wrap: the end's
        side[p] += 1
    return lower, higher


def multicast_links(n: int, root: int, topology: Topology = MESH) -> tuple[np.ndarray, np.ndarray]:
    """A multicast from `root` passes every link of its routes to the line's other cores once, away from it (as
    line_links): on a mesh every link of the line."""
    if topology.kind != "mesh":
        return routes_links(n, [(root, b) for b in range(n) if b != root], topology, once=True)
    lower, higher = np.zeros(n), np.zeros(n)
    higher[root:n - 1] = 1
    lower[1:root + 1] = 1
    return lower, higher


def ring_successors(n: int, topology: Topology = MESH) -> tuple[np.ndarray, np.ndarray]:
    """The ring a "ring" allreduce goes round on a line of n cores (``Topology.ring_order``: the folded ring on a
    mesh, ring neighbours at most 2 hops apart; the line itself on a torus): (each position's place on the ring,
    each position's successor)."""
    order = list(topology.ring_order(n))  # the owner of a ring's order (core.topology)
    ring_index = np.empty(n, np.int64)
    ring_index[order] = np.arange(n)
    return ring_index, np.array(order[1:] + order[:1])[ring_index]


@lru_cache(maxsize=4096)
def allreduce_links(algo: str, n: int, k: int, topology: Topology = MESH) -> tuple[np.ndarray, np.ndarray]:
    """Messages over each link of a line of n cores in one `algo` allreduce, as the hop-by-hop algorithm
    sends them over `topology`: (whole-vector messages, segment messages) of shape (2, n) each -- [toward
    lower, toward higher] -- a segment being one of the n padded pieces ring and pipeline cut the vector into."""
    whole, seg = np.zeros((2, n)), np.zeros((2, n))
    if n == 1:
        return whole, seg
    if algo in ("ktree", "chain"):
        plan = tree_plan(algo, n, k)
        for step in (step for level in plan.levels for step in level.steps):
            for d, srcs in step:
                whole += line_links(n, srcs, d, topology)
        whole += multicast_links(n, plan.root, topology)
    elif algo == "ring":
        _, succ = ring_successors(n, topology)
        for p in range(n):
            seg += 2 * (n - 1) * np.array(line_links(n, [p], int(succ[p] - p), topology))
    else:  # pipeline: every core but the first passes each of the n segments one hop down, then a multicast
        seg += n * np.array(line_links(n, np.arange(1, n), -1, topology))
        whole += multicast_links(n, 0, topology)
    return whole, seg
