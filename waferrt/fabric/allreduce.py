"""The allreduce algorithms hop by hop along the lines of a LineComm (waferrt.fabric.comm).

Contract: each function runs one algorithm of ``LineComm.allreduce``'s checked mode over `comm` -- a
:class:`~waferrt.fabric.comm.LineComm`, whose ``transfer`` forwards every message hop by hop (across tiles
too), whose ``multicast`` sends a root's value down the line and whose ledger books each step -- and returns
the reduction with a line axis of length 1: :func:`ktree` (WaferLLM's K-level tree, or the SDK's "chain":
``core.cost.tree_plan``), :func:`ring` (reduce-scatter + allgather round ``Topology.ring_order``) and
:func:`pipeline` (segments streamed down a chain, then a multicast). Every tile of the region calls the same
algorithm in the same order (SPMD). :class:`Slices` says where a buffer holds its line's slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, serialise_cycles

from .line_links import ring_successors


@dataclass(frozen=True)
class Slices:
    """Where a buffer holds the slices of a line's cores: along array `axis` (this tile's cores, in region
    order); `replicated`: every line holds the same values (a message carries them once, not a share)."""

    axis: int = 0
    replicated: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.axis, int) or self.axis < 0:
            raise ValueError(f"Slices.axis is the array axis of the line's cores, an int >= 0; got {self.axis!r}")


AXIS_0 = Slices()  # the default: each core's own slice, on the first array axis


@dataclass(frozen=True)
class Partials:
    """A K-tree's partial sums: `acc`, the buffer reduced in, and `line`, the same memory with the line axis
    first when the whole line is in this tile (its steps run in memory), else None (they cross tiles)."""

    acc: np.ndarray
    line: np.ndarray | None


def per_position(buf: np.ndarray, axis: int) -> int:
    """Values each line position holds in `buf` (all axes but the line axis)."""
    return int(np.prod(buf.shape)) // max(buf.shape[axis], 1)


def ktree(comm, buf: np.ndarray, plan, ufunc, slices: Slices, overwrite: bool = False) -> np.ndarray:
    """WaferLLM's K-tree along the line (``plan``: core.cost.ktree_plan). Every step moves each sender's
    partial sum to the next member of its chain, hop by hop (across tiles by ``transfer``), and the
    receiver adds it in; the steps are streamed (each pays hops and beta), the message serialised once
    per stream a level's roots read. overwrite=True reduces in `buf` itself."""
    array_axis = slices.axis
    acc = buf if overwrite else buf.copy()
    whole = comm.m == comm.n  # the whole line is in this tile: in-memory steps
    a = acc.swapaxes(0, array_axis) if whole else None
    partials = Partials(acc, a)
    nbytes = comm.message_bytes(per_position(buf, array_axis), buf.itemsize, slices.replicated)
    for level in plan.levels:
        for step in level.steps:
            with comm.ledger.streamed(), comm.ledger.concurrent():
                moved = [_ktree_step(comm, partials, dist, src, slices, nbytes) for dist, src in step]
            for pos, val in moved:
                if whole:
                    a[pos] = ufunc(a[pos], val)
                else:
                    _combine(acc, pos, val, array_axis, ufunc)
        comm.ledger.add(Cost(cycles=level.halves * serialise_cycles(comm.ledger.spec, nbytes)))
    return comm.multicast(acc, plan.root, array_axis, slices.replicated, spread=False)


def _ktree_step(comm, partials: Partials, dist: int, src, slices: Slices, nbytes: float):
    """One chain step of the K-tree: the cores at `src` hand their partial sums `dist` hops along the line.
    Returns (receiving positions, values) -- region positions into ``partials.line`` when the line is in this
    tile."""
    if partials.line is not None:
        src = np.asarray(src)
        comm.ledger.message(comm.topo.step_hops(comm.n, src, dist), nbytes, len(src) * comm.lines)
        comm.record(src, dist, nbytes)
        return src + dist, partials.line[src]
    return comm.transfer(partials.acc, src, dist, slices.axis, slices.replicated)


def ring(comm, flat: np.ndarray, ufunc, replicated: bool) -> np.ndarray:
    """Reduce-scatter then allgather of `flat` (m, V) round the line's ring (``Topology.ring_order``: the folded
    ring of a mesh, ring neighbours at most 2 hops apart; a torus's line, 1 hop each, the wrap closing it)."""
    n = comm.n
    ring_index, succ = ring_successors(n, comm.topo)
    chunks = _split_chunks(comm, flat, replicated)
    pos_all = np.arange(n)

    def step(shift):
        by_dist: dict[int, list[int]] = {}
        for p in pos_all:
            by_dist.setdefault(int(succ[p] - p), []).append(int(p))
        return [(np.array(ps), (ring_index[ps] - shift) % n, dist) for dist, ps in sorted(by_dist.items())]

    _chunk_steps(comm, chunks, [step(s) for s in range(n - 1)], ufunc, replicated)
    _chunk_steps(comm, chunks, [step(s - 1) for s in range(n - 1)], None, replicated)
    return _join_chunks(chunks, flat.shape[1])[:1]


def pipeline(comm, flat: np.ndarray, ufunc, replicated: bool) -> np.ndarray:
    """The n segments of `flat` (m, V) streamed down a chain to core 0, reduced on the way, then a multicast."""
    n = comm.n
    chunks = _split_chunks(comm, flat, replicated)
    steps = []
    for tau in range(2 * (n - 1)):
        p = np.arange(1, n)
        seg = tau - (n - 1 - p)
        ok = (seg >= 0) & (seg < n)
        if ok.any():
            steps.append([(p[ok], seg[ok], -1)])
    _chunk_steps(comm, chunks, steps, ufunc, replicated)
    acc = _join_chunks(chunks, flat.shape[1])
    return comm.multicast(acc, 0, 0, replicated, spread=False)


def _chunk_steps(comm, chunks, steps, ufunc, replicated):
    """chunks: (m, n_chunks, lines, c). Each step is a list of (src positions, chunk index per src, dist);
    every src sends that chunk `dist` hops, all at once; the receiver combines (or, ufunc None,
    overwrites) its same chunk."""
    for step in steps:
        received = []
        with comm.ledger.concurrent():
            for src, idx, dist in step:
                send = np.zeros((comm.m,) + chunks.shape[2:], chunks.dtype)
                local = (src >= comm.lo) & (src < comm.lo + comm.m)
                send[src[local] - comm.lo] = chunks[src[local] - comm.lo, idx[local]]
                pos, val = comm.transfer(send, src, dist, 0, replicated)
                received.append((pos, (idx[np.searchsorted(src, pos + comm.lo - dist)]), val))
        for pos, idx, val in received:
            cur = chunks[pos, idx]
            chunks[pos, idx] = val if ufunc is None else ufunc(cur, val)


def _split_chunks(comm, flat: np.ndarray, replicated: bool) -> np.ndarray:
    """(m, V) -> (m, n, lines, c): each line's block cut in n equal zero-padded segments (a copy); a
    replicated buffer is one line's block."""
    lines = 1 if replicated else max(comm.lines, 1)
    m, v = flat.shape
    blk = v // lines
    c = cdiv(blk, comm.n) if blk else 0
    out = np.zeros((m, lines, comm.n * c), flat.dtype)
    out[:, :, :blk] = flat.reshape(m, lines, blk)
    return np.ascontiguousarray(out.reshape(m, lines, comm.n, c).transpose(0, 2, 1, 3))


def _join_chunks(chunks: np.ndarray, v: int) -> np.ndarray:
    """(m, n, lines, c) -> (m, V): the inverse of _split_chunks."""
    m, _, lines, _ = chunks.shape
    return chunks.transpose(0, 2, 1, 3).reshape(m, lines, -1)[:, :, : v // lines].reshape(m, v)


def _combine(acc: np.ndarray, pos: np.ndarray, val: np.ndarray, axis: int, ufunc) -> None:
    idx = [slice(None)] * acc.ndim
    idx[axis] = pos
    acc[tuple(idx)] = ufunc(acc[tuple(idx)], val)
