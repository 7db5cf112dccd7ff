"""Collectives along one mesh axis of a region, built only from routed neighbour hops.

Contract: a :class:`LineComm` is one tile's view of the lines of a region along mesh axis "x" (rows of
cores, messages go E/W) or "y" (columns, messages go N/S). Arrays carry the line position on
``array_axis`` (this tile's cores only, in region order); all other array axes are data. The region may
span several tiles: the part of a message that leaves this tile goes to the neighbour tile over
``links`` (the fabric), which forwards it further when it is not the destination. Every tile that holds a
part of the region must call the same collectives in the same order (SPMD); message tags are checked.

Primitives: ``transfer`` (chosen cores send to the core ``dist`` hops along the line, forwarded hop by
hop), ``broadcast`` (multicast from a root), ``shift`` (with or without wrap), ``allreduce`` with the
"ktree" (WaferLLM's K-level tree: both halves of every group reduce toward its middle core at once, partial
sums streamed word by word, then a multicast from the last root), "chain" (one streamed chain to core 0, the
Cerebras SDK's GEMV), "ring" (reduce-scatter +
allgather on the folded ring, logical neighbours at most 2 hops apart) and "pipeline" (segments streamed
down a chain, then a multicast) algorithms, run hop by hop by waferrt.fabric.allreduce. Costs go to the
:class:`~waferrt.core.ledger.Ledger`.

Routes follow the spec's topology (core.topology): a message's hops are ``Topology.step_hops`` (a torus's
wrap on a line that spans the whole wafer, a mesh-switch's switch), a multicast's ``Topology.farthest``, the
ring's order ``Topology.ring_order`` -- what core.cost's closed forms count. The bytes themselves travel
between tile programs over `links` as ever (the emulator's transport); the route is what is booked.

Fast path (``fast=True``, for a region that lies wholly in this tile, as every decode region does): an
allreduce of float32 data computes its result in one vectorised reduction and books exactly the messages
the hop-by-hop algorithm sends (``book_allreduce``); tests/unit/test_fast_path.py holds the two modes to
the same results and the same counts on every mesh of the test matrix. The hop-by-hop path is the
checked mode.

Link taps: ``LineComm.listen(tap)`` (a region wholly in this tile) makes every message the comm books also
reach ``tap(comm, lower, higher)``: the bytes it put on each link of every one of the comm's lines, toward
lower and higher positions ((n,) each, indexed by the core the link leaves; fabric.line_links: each message's
route over the line's topology, ``Topology.route``, as its booking's hops are ``Topology.step_hops``), e.g. a
fast allreduce's messages as its algorithm sends them (``line_links.allreduce_links``), so a caller can
keep every link's traffic per phase as the run goes (waferrt.decode.linkload.PhaseLinks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from waferrt.core.cost import ALLREDUCE_ALGOS, allreduce_cost, on_lines, segment_bytes, tree_plan
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Dir, Region

from .allreduce import AXIS_0, Slices, ktree, per_position, pipeline, ring
from .line_links import allreduce_links, line_links, multicast_links
from .links import Links

REDUCE_OPS = {"sum": np.add, "max": np.maximum}


@dataclass(frozen=True)
class Collectives:
    """How a program's collectives run: the allreduce algorithm ("ktree" with `k` levels, "chain", "ring",
    "pipeline"), and whether a region that lies wholly in one tile takes the fast path (results computed
    at once, every message of the algorithm booked) or moves every message hop by hop (the checked mode)."""

    algo: str = "ktree"
    k: int = 2
    fast: bool = True

    def __post_init__(self) -> None:
        if self.algo not in ALLREDUCE_ALGOS:
            raise ValueError(f"unknown allreduce algorithm {self.algo!r}; choose one of {ALLREDUCE_ALGOS}")
        if self.k < 1:
            raise ValueError(f"a K-tree needs K >= 1 levels, got {self.k}")


KTREE_FAST = Collectives()  # the default: K-tree with K=2, fast path


@dataclass(frozen=True, eq=False)
class Span:
    """Where a kernel, or a line's collectives, run: the whole `region`, the `tile` this program runs on
    (its cores of the region: ``local``), the links to the neighbour tiles (None: the region lies
    wholly in this tile, nothing crosses a tile border), and the `wafer`'s mesh (a torus's wrap links join
    the ends of its whole lines)."""

    region: Region
    tile: Region
    links: Links | None = None
    wafer: Region | None = None  # the whole mesh (a torus wraps at its edges); None: the spec's full_mesh

    def __post_init__(self) -> None:
        if self.region.intersect(self.tile) is None:
            raise ValueError(f"the kernel's region {self.region} has no core in the tile {self.tile}")

    @classmethod
    def of(cls, region: Region) -> Span:
        """A region wholly in this tile."""
        return cls(region, region)

    @property
    def local(self) -> Region:
        """This tile's cores of the region."""
        return self.region.intersect(self.tile)


LinkTap = Callable[["LineComm", np.ndarray, np.ndarray], None]  # (comm, bytes toward lower, toward higher)


class LineComm:
    def __init__(self, axis: str, span: Span, ledger: Ledger, tag_prefix: str = "", fast: bool = False):
        if axis not in ("x", "y"):
            raise ValueError(f"a line runs along mesh axis 'x' or 'y', got {axis!r}")
        region, local, links = span.region, span.local, span.links
        self.axis, self.region, self.local, self.links, self.ledger = axis, region, local, links, ledger
        self.fast = fast and local == region  # the fast path needs every core of the region in this tile
        if axis == "x":
            self.n, self.lo, self.m, self.lines = region.w, local.x0 - region.x0, local.w, local.h
            self.fwd = Dir.E
        else:
            self.n, self.lo, self.m, self.lines = region.h, local.y0 - region.y0, local.h, local.w
            self.fwd = Dir.S
        wafer = span.wafer and (span.wafer.w if axis == "x" else span.wafer.h)
        self.spec = ledger.spec.on_line(axis, self.n, wafer)  # a torus's wrap only on a whole line of the wafer
        self.topo = self.spec.topology  # the routes of this line (core.topology)
        self._tag_prefix = tag_prefix
        self._seq = 0
        self.tap: LinkTap | None = None
        self._booked: dict[tuple, tuple] = {}  # book_allreduce's (algo, k, values, replicated) -> (bytes, Cost)

    def listen(self, tap: LinkTap | None) -> None:
        """Tell `tap` the bytes every message booked from now on puts on each link (module docstring)."""
        if tap is not None and self.local != self.region:
            raise ValueError(f"a link tap sees a region wholly in one tile; {self.region} spans beyond {self.local}")
        self.tap = tap

    def record(self, src, dist: int, nbytes: float) -> None:
        """The tap's share of a booked stage: the cores at `src` of every line each sent `nbytes` `dist` positions,
        each by its route over this line's topology (the booking's: a torus's wrap, a mesh-switch's ports)."""
        if self.tap is not None:
            lower, higher = line_links(self.n, src, dist, self.topo)
            self.tap(self, lower * nbytes, higher * nbytes)

    # -- plumbing -------------------------------------------------------------------------------------
    def _tag(self) -> str:
        self._seq += 1
        return f"{self._tag_prefix}{self.axis}{self._seq}"

    def has_tile(self, d: Dir) -> bool:
        """Does the region continue into the neighbour tile in direction d (along this line)?"""
        return self.lo > 0 if d == self.fwd.opposite else self.lo + self.m < self.n

    def message_bytes(self, values_per_pos: int, itemsize: int, replicated: bool) -> float:
        """Bytes of one core's message of a buffer holding `values_per_pos` values per line position (all the
        lines' slices, unless `replicated`)."""
        per_line = values_per_pos if replicated else values_per_pos / max(self.lines, 1)
        return per_line * itemsize

    def transfer(self, buf: np.ndarray, src, dist: int, array_axis: int = 0, replicated: bool = False,
                 senders: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The cores at line positions `src` (region coordinates) each send their slice of `buf` to the
        core `dist` hops along the line. Returns (local destination positions, received values stacked
        on array_axis). Books one routing stage of |dist| hops, and a message per sending core of this
        tile (`senders`, when only some cores of those lines send: the others' slices are zeros)."""
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = src + dist
        if dist == 0 or (len(src) and (dst.min() < 0 or dst.max() >= self.n)):
            raise ValueError(f"transfer of {dist} hops from positions {src.tolist()} leaves the line of "
                             f"{self.n} cores")
        mine = (src >= self.lo) & (src < self.lo + self.m)
        stays = mine & (dst >= self.lo) & (dst < self.lo + self.m)
        leaves = mine & ~stays
        got_pos = [dst[stays] - self.lo]
        got_val = [np.take(buf, src[stays] - self.lo, axis=array_axis)]
        out_pos, out_val = dst[leaves], np.take(buf, src[leaves] - self.lo, axis=array_axis)
        d = self.fwd if dist > 0 else self.fwd.opposite
        tag = self._tag()
        if self.has_tile(d.opposite):
            pos, val = self.links.recv(d.opposite, tag)
            here = (pos >= self.lo) & (pos < self.lo + self.m)
            got_pos.append(pos[here] - self.lo)
            got_val.append(np.compress(here, val, axis=array_axis))
            out_pos = np.concatenate([pos[~here], out_pos])
            out_val = np.concatenate([np.compress(~here, val, axis=array_axis), out_val], axis=array_axis)
        if self.has_tile(d):
            self.links.send(d, tag, [out_pos, np.ascontiguousarray(out_val)])
        elif len(out_pos):
            raise RuntimeError(f"transfer lost {len(out_pos)} message(s) at the edge of the region")
        vals_per_pos = per_position(buf, array_axis)
        nbytes = self.message_bytes(vals_per_pos, buf.itemsize, replicated)
        hops = self.topo.step_hops(self.n, src, dist)  # the route per topology: a torus's wrap, a switch
        self.ledger.message(hops, nbytes, int(mine.sum()) * self.lines if senders is None else senders)
        self.record(src[mine], dist, nbytes)
        return np.concatenate(got_pos), np.concatenate(got_val, axis=array_axis)

    # -- primitives -----------------------------------------------------------------------------------
    def broadcast(self, buf: np.ndarray, root: int = 0, array_axis: int = 0, replicated: bool = False
                  ) -> np.ndarray:
        """Every core of the line gets the root core's slice (router multicast: one stage)."""
        if not 0 <= root < self.n:
            raise ValueError(f"broadcast root {root} is outside the line of {self.n} cores")
        with self.ledger.op("broadcast"):
            return self.multicast(buf, root, array_axis, replicated)

    def multicast(self, buf: np.ndarray, root: int, array_axis: int, replicated: bool,
                  spread: bool = True) -> np.ndarray:
        """The root core's slice to every core of the line, booked as one stage in the op under way (broadcast's,
        or an allreduce's last step); spread=False returns it with a line axis of length 1."""
        tag = self._tag()
        if self.lo <= root < self.lo + self.m:
            val = np.take(buf, [root - self.lo], axis=array_axis)
            for d in (self.fwd, self.fwd.opposite):
                if self.has_tile(d):
                    self.links.send(d, tag, [np.ascontiguousarray(val)])
        else:
            toward_root = self.fwd.opposite if root < self.lo else self.fwd
            (val,) = self.links.recv(toward_root, tag)
            if self.has_tile(toward_root.opposite):
                self.links.send(toward_root.opposite, tag, [val])
        vals_per_pos = per_position(buf, array_axis)
        if self.n > 1:
            nbytes = self.message_bytes(vals_per_pos, buf.itemsize, replicated)
            msgs = (self.n - 1) * self.lines if self.lo == 0 else 0
            self.ledger.message(self.topo.farthest(self.n, root), nbytes, msgs, link_bytes=msgs * nbytes)
            if self.tap is not None:
                lower, higher = multicast_links(self.n, root, self.topo)
                self.tap(self, lower * nbytes, higher * nbytes)
        return _spread(val, self.m, array_axis) if spread else val

    def shift(self, buf: np.ndarray, dist: int = 1, wrap: bool = False, array_axis: int = 0,
              replicated: bool = False) -> np.ndarray:
        """Every core sends its slice one hop along the line (dist=+1: E or S; -1: W or N). Without wrap
        the first core receives zeros; with wrap the last core's slice travels back to the first."""
        if dist not in (1, -1):
            raise ValueError(f"shift moves one hop (dist=+1 or -1), got {dist}; shift again for each further "
                             "hop, or use transfer(src, dist) to send chosen cores' slices dist hops")
        out = np.zeros_like(buf)
        if self.n == 1:  # a line of one core: nothing moves (booked, at zero cost)
            with self.ledger.op("shift"):
                if wrap:
                    out[...] = buf
            return out
        inner = np.arange(self.n - 1) + (0 if dist > 0 else 1)
        with self.ledger.op("shift"), self.ledger.concurrent():
            moved = [self.transfer(buf, inner, dist, array_axis, replicated)]
            if wrap:
                end = self.n - 1 if dist > 0 else 0
                moved.append(self.transfer(buf, [end], -dist * (self.n - 1), array_axis, replicated))
        for pos, val in moved:
            _put(out, pos, val, array_axis)
        return out

    def allreduce(self, buf: np.ndarray, coll: Collectives = KTREE_FAST, op: str = "sum",
                  slices: Slices = AXIS_0, collapse: bool = False, overwrite: bool = False) -> np.ndarray:
        """Every core of the line ends with the reduction (sum or max) of all the line's slices (`slices`: where
        they lie in `buf`), by the `coll.algo` allreduce with `coll.k` levels (fast or hop by hop: this
        comm's `fast`, set when it was made). With collapse=True the result is returned once, without the
        line axis (every core of the line holds the same value; the emulator keeps one copy). overwrite=True
        lets the K-tree reduce in `buf` itself (a scratch buffer of the caller's)."""
        if op not in REDUCE_OPS:
            raise ValueError(f"allreduce op is one of {sorted(REDUCE_OPS)}, got {op!r}")
        algo, k, array_axis, replicated = coll.algo, coll.k, slices.axis, slices.replicated
        if self.n == 1:  # a line of one core: nothing moves (booked, at zero cost)
            with self.ledger.op(f"allreduce.{algo}"):
                return np.take(buf, 0, axis=array_axis) if collapse else buf.copy()
        ufunc = REDUCE_OPS[op]
        with self.ledger.op(f"allreduce.{algo}"):
            if self.fast and buf.dtype == np.float32:  # the result at once, the algorithm's messages booked
                out = ufunc.reduce(buf, axis=array_axis, keepdims=True)
                self.book_allreduce(algo, k, per_position(buf, array_axis), replicated)
            elif algo in ("ktree", "chain"):
                out = ktree(self, buf, tree_plan(algo, self.n, k), ufunc, slices, overwrite)
            else:
                acc = np.moveaxis(buf, array_axis, 0)
                flat = acc.reshape(self.m, -1)
                red = (ring if algo == "ring" else pipeline)(self, flat, ufunc, replicated)
                out = np.moveaxis(red.reshape((1,) + acc.shape[1:]), 0, array_axis)
        return np.take(out, 0, axis=array_axis) if collapse else _spread(out, self.m, array_axis)

    def book_allreduce(self, algo: str, k: int, values_per_position: int, replicated: bool = False) -> None:
        """Book what the `algo` allreduce of float32 slices of `values_per_position` values moves along every
        line, message for message as the hop-by-hop algorithm does (its closed form, times the lines),
        without moving anything: for fast paths that compute the result another way (inside an op)."""
        key = (algo, k, values_per_position, replicated)
        if key not in self._booked:  # the same closed form every step: worked out once per line and size
            nbytes = self.message_bytes(values_per_position, 4, replicated)
            self._booked[key] = nbytes, on_lines(allreduce_cost(self.spec, algo, self.n, nbytes, k), self.lines)
        nbytes, cost = self._booked[key]
        self.ledger.add(cost)
        if self.tap is not None:
            whole, seg = allreduce_links(algo, self.n, k, self.topo)
            out = whole * nbytes + seg * segment_bytes(nbytes, self.n)
            self.tap(self, out[0], out[1])


def _spread(val: np.ndarray, m: int, axis: int) -> np.ndarray:
    """A value with a line axis of length 1, copied to the m cores of the line."""
    reps = [1] * val.ndim
    reps[axis] = m
    return np.tile(val, reps)


def _put(out: np.ndarray, pos: np.ndarray, val: np.ndarray, axis: int) -> None:
    idx = [slice(None)] * out.ndim
    idx[axis] = pos
    out[tuple(idx)] = val
