"""The kernel context, ``waferrt.Context``: one tile's share of the cores of a region, as an SPMD kernel sees it.

Contract: a kernel is a plain function ``kernel(ctx, **args)`` that returns nothing. Every tile that holds
cores of the kernel's region runs it once, with a :class:`Context` for its part. Data are numpy arrays
whose first two axes are this tile's cores of the region, (rows, cols) = [y, x] in region order, followed
by each core's block. A core only touches its own block; data move between cores only through the
context's primitives, which go one hop at a time (forwarded through the cores in between) and book their
cost in the context's ledger. docs/PROGRAMMING.md is the reference; in short:

- ``ctx.send(buf, dx, dy, where=None, wrap=False)``: every core sends its block one hop to (x+dx, y+dy)
  (wrap=True: the far edge's cores over a torus's wrap link; core.topology).
- ``ctx.shift(buf, axis, dist=+1|-1, wrap=False)``, ``ctx.broadcast(buf, axis, root=0)``,
  ``ctx.allreduce(buf, axis, algo="ktree"|"ring"|"pipeline", k=2, op="sum"|"max")``.
- ``ctx.gemv(w, x, axis)``: MeshGEMV, local block GEMV then an allreduce along `axis`.
- ``ctx.load(name)`` / ``ctx.store(name, blocks)``: this tile's blocks of a DSM tensor.
- ``ctx.compute(flops)``: book the flops ONE core does outside a primitive; ``ctx.log(...)``: a line to the
  host, labelled by tile (``print`` in a kernel does the same).

Axes: mesh axis "x" runs along a row of cores (East = +1), "y" along a column (South = +1); array axis 1
is x, array axis 0 is y. Every tile of the region must call the same primitives in the same order (SPMD):
the tiles check it with each other as the kernel ends (waferrt.fabric.misuse.NotSpmd). Faults: see RegionView
(``ctx.live``, ``ctx.can_send``, ``where=``); a primitive that needs a dead core or link raises CoreFailed /
LinkFailed naming it.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from waferrt.core.cost import reduce_flops
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Coord, Dir
from waferrt.core.topology import LineCore
from waferrt.faults.errors import PayloadCorrupt
from waferrt.faults.faultmap import FaultMap

from .comm import Collectives, LineComm, Slices, Span
from .debug import user_site
from .links import FabricError
from .misuse import from_neighbour
from .view import RegionView


class NotNeighbourError(ValueError):
    """A core asked to send to a core that is not one hop away (``core``: the sender)."""

    def __init__(self, message: str, core: Coord):
        super().__init__(message)
        self.core = core

    def __reduce__(self):
        return type(self), (str(self), self.core)


def _span(cores: list[Coord]) -> str:
    """A line of cores for a message: the first..the last (or the one)."""
    return f"{cores[0]}" if len(cores) == 1 else f"{cores[0]}..{cores[-1]}"


class Context(RegionView):
    """This tile's cores of a kernel's region: the ``ctx`` every kernel gets (docs/PROGRAMMING.md).

    >>> from waferrt.core.mesh import MeshSpec
    >>> from waferrt.core.spec import TINY
    >>> from waferrt.fabric.loop import simulate
    >>> mesh = MeshSpec(4, 2, 2, 2)                               # 4x2 cores, two tiles of 2x2
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4, 1)       # (rows, cols, block): one value per core
    >>> out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.shift(x, "x", 1), x=x)
    >>> out[..., 0]                                               # each core got its West neighbour's value
    array([[0., 0., 1., 2.],
           [0., 4., 5., 6.]], dtype=float32)
    """

    def __init__(self, span: Span, ledger: Ledger, store: dict, tag: str = "", faults: FaultMap | None = None):
        super().__init__(span.region, span.tile, store, faults, ledger.spec)
        self.ledger, self.tag = ledger, tag
        self.x = LineComm("x", span, ledger, f"{tag}:")
        self.y = LineComm("y", span, ledger, f"{tag}:")
        self.calls: list[tuple[str, str]] = []  # (primitive, its line) run so far: the tiles compare the primitives

    def _comm(self, axis: str) -> tuple[LineComm, int]:
        if axis == "x":
            return self.x, 1
        if axis == "y":
            return self.y, 0
        raise ValueError(f"mesh axis is 'x' (along a row of cores, E/W; array axis 1) or 'y' (along a column, "
                         f"N/S; array axis 0), got {axis!r}")

    @contextmanager
    def _primitive(self, what: str, *bufs: np.ndarray):
        """A primitive every tile of the region runs: checked, recorded with its line of the kernel; a
        neighbour tile that ended (or failed) instead of taking part is said so (misuse.from_neighbour)."""
        for b in bufs:
            self._check(b, what)
        site = user_site()
        self.calls.append((what, f"{site.file}:{site.line}" if site else "?"))
        try:
            yield
        except FabricError as e:
            better = from_neighbour(e, what, site, self.calls)
            if better is e:
                raise
            raise better from e
        except PayloadCorrupt as e:
            raise self._corrupt(e, what, site) from None

    def _corrupt(self, e: PayloadCorrupt, what: str, site) -> PayloadCorrupt:
        """`e` (a payload that failed its checksum on its way into this tile) said as the kernel's primitive,
        its line and the cores on both sides of the tile border it crossed."""
        d = Dir[e.side]
        xs, ys = self.coords()
        edge = {Dir.E: (xs[:, -1], ys[:, -1]), Dir.W: (xs[:, 0], ys[:, 0]),
                Dir.N: (xs[0], ys[0]), Dir.S: (xs[-1], ys[-1])}[d]
        here = [Coord(int(x), int(y)) for x, y in zip(*edge)]
        there = [Coord(c.x + d.value[0], c.y + d.value[1]) for c in here]
        at = f" at {site}" if site else ""
        out = PayloadCorrupt(e.receiver, e.sender, e.side,
                             f"the payload of {what}{at} from cores {_span(there)} to cores {_span(here)}")
        out.core = here[0]
        return out

    # -- primitives -----------------------------------------------------------------------------------
    def send(self, buf: np.ndarray, dx: int, dy: int, where=None, wrap: bool = False) -> np.ndarray:
        """Every core (or only those where `where`, a (rows, cols) bool array, holds) sends its block to the
        core at (x+dx, y+dy), which must be a neighbour (|dx| + |dy| = 1: dx=+1 East, dy=+1 South); returns
        what each core received, zeros where no core sent to it (the cores at the region's edge that no one
        faces, and the receivers of cores that `where` left out). A sender's receiver must be alive: leave
        out those that face a dead core or link (``where=ctx.can_send(dx, dy)``). Booked as ``send``: one
        routing stage of one hop, a message per core that sends.

        >>> from waferrt.core.mesh import MeshSpec
        >>> from waferrt.core.spec import TINY
        >>> from waferrt.fabric.loop import simulate
        >>> mesh = MeshSpec(2, 3, 2, 2)                           # 2x3 cores: tiles of 2x2 and 2x1
        >>> x = np.arange(1, 7, dtype=np.float32).reshape(3, 2, 1)
        >>> out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.send(x, 0, 1), x=x)  # South
        >>> out[..., 0], cost["send"].messages                    # row 0 gets zeros: no core North of it
        (array([[0., 0.],
               [1., 2.],
               [3., 4.]], dtype=float32), 4)
        """
        if wrap:
            return self._send_wrap(buf, dx, dy, where)
        if abs(dx) + abs(dy) != 1:
            a = Coord(self.local.x0, self.local.y0)
            b = Coord(a.x + dx, a.y + dy)
            raise NotNeighbourError(
                f"core {a} cannot send to core {b}: they are {a.hops_to(b)} hops apart and a core has links "
                "only to its N/E/S/W neighbours. Move data one hop at a time (ctx.send with |dx|+|dy| = 1), "
                "or use ctx.shift / ctx.broadcast / ctx.allreduce, which forward hop by hop.", a)
        d = Dir.of_step(dx, dy)
        with self._primitive(f"ctx.send {d.name}", buf):
            axis, dist = ("x", dx) if dx else ("y", dy)
            senders = None
            if where is None:
                self._need(f"ctx.send {d.name}", axis=axis)
            else:
                chosen = [c for c in self._chosen(where) if self.region.contains(c.step(d))]
                self._need(f"ctx.send {d.name} (where=)", chosen)
                for c in chosen:
                    self._need(f"ctx.send {d.name} (where=) from core {c}, which sends to it", [c.step(d)],
                               links=[(c, c.step(d))])
                buf = np.where(self._spread(where, buf), buf, np.zeros((), buf.dtype))  # the others send nothing
                senders = len(chosen)
            with self.ledger.op("send"):
                comm, ax = self._comm(axis)
                out = np.zeros_like(buf)
                src = np.arange(comm.n - 1) + (0 if dist > 0 else 1)
                pos, val = comm.transfer(buf, src, dist, ax, senders=senders)
                idx = [slice(None)] * buf.ndim
                idx[ax] = pos
                out[tuple(idx)] = val
                return out

    def _send_wrap(self, buf: np.ndarray, dx: int, dy: int, where) -> np.ndarray:
        """``ctx.send(..., wrap=True)``: every core sends one hop, the cores at the far edge over the torus's wrap
        link to the near edge. A link the topology lacks (a mesh, or a line narrower than the wafer) raises
        NoSuchLink naming the two cores; booked as ``send``: one stage of one hop."""
        if abs(dx) + abs(dy) != 1 or where is not None:
            raise ValueError(f"ctx.send(wrap=True) moves every core's block one hop (|dx|+|dy| = 1, no where=), "
                             f"got dx={dx}, dy={dy}{', where=' if where is not None else ''}")
        axis, dist = ("x", dx) if dx else ("y", dy)
        comm, ax = self._comm(axis)
        r = self.region
        last = Coord(r.x1 - 1, r.y0) if axis == "x" else Coord(r.x0, r.y1 - 1)
        ends = (LineCore(comm.n - 1, last), LineCore(0, Coord(r.x0, r.y0)))  # the line's last core, its first
        far, near = ends if dist > 0 else ends[::-1]
        comm.topo.check_link(comm.n, far, near)
        with self._primitive(f"ctx.send {Dir.of_step(dx, dy).name} wrap", buf):
            self._need(f"ctx.send {Dir.of_step(dx, dy).name} wrap", axis=axis)
            with self.ledger.op("send"):
                return comm.shift(buf, dist, True, ax)

    def shift(self, buf: np.ndarray, axis: str, dist: int = 1, wrap: bool = False) -> np.ndarray:
        """Every core of the region sends its block one hop along `axis` ("x": dist=+1 East, -1 West; "y":
        +1 South, -1 North), all at once. Without `wrap`, the cores at the start of each line (West or North
        edge for dist=+1) receive zeros; with it, the last core's block travels back along the line to the
        first (n-1 hops). Booked as ``shift``: one routing stage (two with wrap), a message per core.

        Examples:
            >>> from waferrt.core.mesh import MeshSpec
            >>> from waferrt.core.spec import TINY
            >>> from waferrt.fabric.loop import simulate
            >>> mesh = MeshSpec(4, 1, 2, 1)
            >>> x = np.arange(1, 5, dtype=np.float32).reshape(1, 4, 1)
            >>> simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.shift(x, "x", -1, wrap=True), x=x)[0][..., 0]
            array([[2., 3., 4., 1.]], dtype=float32)
        """
        with self._primitive(f"ctx.shift along {axis}", buf):
            comm, ax = self._comm(axis)
            if dist not in (1, -1):
                raise ValueError(f"ctx.shift moves every block one hop (dist=+1 or -1), got {dist}; for more hops "
                                 f"call it {abs(dist)} times (each hop is booked), or use ctx.send for one hop with "
                                 "where=")
            self._need(f"ctx.shift along {axis}", axis=axis)
            return comm.shift(buf, dist, wrap, ax)

    def broadcast(self, buf: np.ndarray, axis: str, root: int = 0) -> np.ndarray:
        """Every core of each line along `axis` gets the block of the line's `root`-th core (counted from the
        region's West edge for "x", North edge for "y"), by router multicast. Booked as ``broadcast``: one
        routing stage of max(root, n-1-root) hops, n-1 messages per line.

        Examples:
            >>> from waferrt.core.mesh import MeshSpec
            >>> from waferrt.core.spec import TINY
            >>> from waferrt.fabric.loop import simulate
            >>> mesh = MeshSpec(1, 4, 1, 2)
            >>> x = np.arange(1, 5, dtype=np.float32).reshape(4, 1, 1)
            >>> simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.broadcast(x, "y", root=2), x=x)[0][:, 0, 0]
            array([3., 3., 3., 3.], dtype=float32)
        """
        with self._primitive(f"ctx.broadcast along {axis}", buf):
            comm, ax = self._comm(axis)
            self._need(f"ctx.broadcast along {axis}", axis=axis)
            return comm.broadcast(buf, root, ax)

    def allreduce(self, buf: np.ndarray, axis: str, algo: str = "ktree", k: int = 2, op: str = "sum"
                  ) -> np.ndarray:
        """Every core ends with the reduction ("sum" or "max") of the blocks of its line along `axis` ("x":
        its row of cores, "y": its column), by the `algo` allreduce ("ktree" with `k` levels, "ring",
        "pipeline"), hop by hop. Booked as ``allreduce.<algo>``: its messages, and the flops of the busiest
        core's reductions (core.cost.reduce_flops).

        >>> from waferrt.core.mesh import MeshSpec
        >>> from waferrt.core.spec import TINY
        >>> from waferrt.fabric.loop import simulate
        >>> mesh = MeshSpec(4, 2, 2, 2)                      # 4x2 cores in two tiles of 2x2
        >>> x = np.arange(8, dtype=np.float32).reshape(2, 4, 1)  # (rows, cols, block): one value per core
        >>> out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.allreduce(x, "x"), x=x)
        >>> out[..., 0]
        array([[ 6.,  6.,  6.,  6.],
               [22., 22., 22., 22.]], dtype=float32)
        >>> cost["allreduce.ktree"].hops, cost["allreduce.ktree"].flops   # 2 levels of 1 add on the root
        (6, 2)
        """
        with self._primitive(f"ctx.allreduce along {axis}", buf):
            comm, ax = self._comm(axis)
            self._need(f"ctx.allreduce along {axis}", axis=axis)
            with self.ledger.op(f"allreduce.{algo}"):
                out = comm.allreduce(buf, Collectives(algo, k), op, Slices(ax))
                self.ledger.compute(reduce_flops(algo, comm.n, _block_values(buf), k))
            return out

    def gemv(self, w: np.ndarray, x: np.ndarray, axis: str, algo: str = "ktree", k: int = 2) -> np.ndarray:
        """MeshGEMV. w: (rows, cols, out_b, in_b) blocks; x: (rows, cols, in_b), the input split along
        `axis` (and replicated along the other). Each core computes w @ x on its block, then the partial
        sums are allreduced along `axis`: the output (rows, cols, out_b) is split along the other axis.
        Booked as ``gemv``: 2 * out_b * in_b flops per core, then the allreduce (its messages and flops).

        >>> from waferrt.core.mesh import MeshSpec
        >>> from waferrt.core.spec import TINY
        >>> from waferrt.fabric.loop import simulate
        >>> mesh = MeshSpec(2, 1, 1, 1)                      # y = W x, W (1, 4): one 1x2 block per core
        >>> w = np.array([[[[1, 2]], [[3, 4]]]], np.float32)   # (rows=1, cols=2, out_b=1, in_b=2)
        >>> x = np.ones((1, 2, 2), np.float32)
        >>> out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, w, x: ctx.gemv(w, x, "x"), w=w, x=x)
        >>> out[..., 0], cost["gemv"].flops                  # 4 flops of block GEMV + 1 add, per core
        (array([[10., 10.]], dtype=float32), 5)
        """
        self._check(w, f"ctx.gemv along {axis}", resident=True)  # the weights stay: only x and y move
        with self._primitive(f"ctx.gemv along {axis}", x):
            comm, ax = self._comm(axis)
            self._need(f"ctx.gemv along {axis}", axis=axis)
            with self.ledger.op("gemv"):
                y = np.matmul(w, x[..., None])[..., 0]
                self.ledger.compute(2 * w.shape[-1] * w.shape[-2])
                out = comm.allreduce(y, Collectives(algo, k), "sum", Slices(ax))
                self.ledger.compute(reduce_flops(algo, comm.n, _block_values(y), k))
                return out

    def compute(self, flops: int) -> None:
        """Book `flops` of local work done by EACH core (per core, not per tile: the cores work side by side,
        so the cycles are those of one core's flops). Not recorded by any primitive: a stencil's update,
        an element-wise op. Booked as ``compute``.

        Examples:
            >>> from waferrt.core.mesh import MeshSpec
            >>> from waferrt.core.spec import TINY
            >>> from waferrt.fabric.loop import simulate
            >>> def scale(ctx, x):
            ...     ctx.compute(x[0, 0].size)                    # one multiply per value of a core's block
            ...     return 2 * x
            >>> mesh = MeshSpec(4, 4, 2, 2)
            >>> simulate(mesh, TINY, mesh.region, scale, x=np.ones((4, 4, 8), np.float32))[1]["compute"].flops
            8
        """
        with self.ledger.op("compute"):
            self.ledger.compute(flops)

    def log(self, *values) -> None:
        """A line to the host, as ``print(*values)`` in a kernel: shown labelled by tile when the run ends.

        >>> from waferrt.core.mesh import MeshSpec, Region
        >>> from waferrt.core.spec import TINY
        >>> from waferrt.fabric.loop import simulate
        >>> def hello(ctx, x):
        ...     ctx.log("cores", ctx.shape)
        ...     return x
        >>> _ = simulate(MeshSpec(4, 2, 2, 2), TINY, Region(0, 0, 4, 2), hello, x=np.zeros((2, 4, 1)))
        [tile(0,0)] cores (2, 2)
        [tile(1,0)] cores (2, 2)
        """
        print(*values)


def _block_values(buf: np.ndarray) -> int:
    """The values in one core's block of a kernel array."""
    return int(np.prod(buf.shape[2:], dtype=np.int64))
