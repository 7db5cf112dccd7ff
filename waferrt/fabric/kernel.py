"""The kernel context: one tile's share of the cores of a region, as seen by an SPMD mesh kernel.

Contract: a kernel is a plain function ``kernel(ctx, **args)``. Every tile that holds cores of the
kernel's region runs it once, with a :class:`Cores` context for its part. Data are numpy arrays whose
first two axes are this tile's cores of the region, (rows, cols) in region order, followed by each
core's block. A core only touches its own block; data move between cores only through the context's
primitives, which go one hop at a time (forwarded through the cores in between) and book their cost:

- ``ctx.send(buf, dx, dy)``: every core sends its block to its neighbour (one hop: N/E/S/W only).
- ``ctx.shift(buf, "x"|"y", dist=±1, wrap=False)``, ``ctx.broadcast(buf, axis, root)``,
  ``ctx.allreduce(buf, axis, algo="ktree"|"ring"|"pipeline", k=2, op="sum"|"max")``.
- ``ctx.gemv(w, x, axis)``: MeshGEMV, local block GEMV then an allreduce along `axis`.
- ``ctx.load(name)`` / ``ctx.store(name, blocks)``: this tile's blocks of a DSM tensor.
- ``ctx.compute(flops)``: book local compute that is not part of a primitive.

Faults (waferrt.faults): the context carries the region's fault map as the command started, the same on
every tile (``ctx.dead_cores``, ``ctx.dead_links``, ``ctx.alive(c)``, ``ctx.live``: this tile's cores alive,
(rows, cols)). A primitive takes every core of the region unless ``where`` (a (rows, cols) bool array of
this tile's cores) says which: ``send``, ``load`` and ``store`` take it. One that needs a dead core raises
:class:`~waferrt.faults.errors.CoreFailed` naming the core and the DSM blocks it lost; one that needs a dead
link (along its axis, for the collectives) :class:`~waferrt.faults.errors.LinkFailed` naming both cores.
Without ``where`` every tile of the region finds the same dead core at the same primitive and raises at
once; with it, only the tile of the chosen cores can tell (its neighbours then wait for it until the
fabric's deadline). A dead core's DSM block is lost: ``load`` without it (``where=ctx.live``) gives zeros
there.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Coord, Dir, Region
from waferrt.faults.faultmap import FaultMap

from .comm import LineComm
from .links import Links


class NotNeighbourError(ValueError):
    """A core asked to send to a core that is not one hop away."""


class Cores:
    """This tile's cores of `region` (``tile`` is the tile's own rectangle of the mesh); ``store`` maps a DSM
    tensor's name to (layout, this tile's blocks of it)."""

    def __init__(self, region: Region, tile: Region, links: Links | None, ledger: Ledger, store: dict,
                 tag: str = "", faults: FaultMap | None = None):
        local = region.intersect(tile)
        if local is None:
            raise ValueError(f"the kernel's region {region} has no core in the tile {tile}")
        self.region, self.local, self.tile, self.ledger, self._store = region, local, tile, ledger, store
        self.faults = faults or FaultMap()
        self.x = LineComm("x", region, local, links, ledger, f"{tag}:")
        self.y = LineComm("y", region, local, links, ledger, f"{tag}:")
        self.spec = ledger.spec

    # -- where am I ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of this tile's cores of the region."""
        return self.local.shape

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """(xs, ys): the global coordinates of this tile's cores, each (rows, cols)."""
        ys, xs = np.mgrid[self.local.y0:self.local.y1, self.local.x0:self.local.x1]
        return xs, ys

    def positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(cols, rows): positions of this tile's cores inside the region, each (rows, cols)."""
        xs, ys = self.coords()
        return xs - self.region.x0, ys - self.region.y0

    # -- what is dead ---------------------------------------------------------------------------------
    @property
    def dead_cores(self) -> frozenset[Coord]:
        """The dead cores of the kernel's region (the same on every tile)."""
        return frozenset(self.faults.in_region(self.region))

    @property
    def dead_links(self) -> frozenset[tuple[Coord, Coord]]:
        """The dead links between two cores of the kernel's region, each as (a, b) with a < b."""
        return frozenset(self.faults.region_links(self.region, "x") + self.faults.region_links(self.region, "y"))

    def alive(self, c: Coord) -> bool:
        """Is core `c` alive? (A core outside the region is asked about all the same.)"""
        return self.faults.alive(c)

    def link_alive(self, a: Coord, b: Coord) -> bool:
        return self.faults.link_alive(a, b)

    @property
    def live(self) -> np.ndarray:
        """(rows, cols) bool: which of this tile's cores are alive (``where=ctx.live`` leaves the dead out)."""
        dead = np.zeros(self.shape, bool)
        for c in self.faults.in_region(self.local):
            dead[c.y - self.local.y0, c.x - self.local.x0] = True
        return ~dead

    def _need(self, what: str, cores=None, axis: str | None = None, links=()) -> None:
        """Raise CoreFailed / LinkFailed if the primitive `what` needs a dead core or link: `cores` (default:
        every core of the region), the dead links along `axis` in the region, and `links`."""
        if not self.faults:
            return
        cores = self.region.cores() if cores is None else cores
        along = self.faults.region_links(self.region, axis) if axis else []
        dead = self.faults.hit(cores, [*along, *links])
        if dead is not None:
            raise self.faults.error(dead, f"needed by {what} in the kernel's region {self.region}; leave the dead "
                                          "out: ctx.live, ctx.dead_cores, where=")

    def _chosen(self, where) -> list[Coord]:
        """This tile's cores where `where` ((rows, cols) bool) holds."""
        where = np.asarray(where, bool)
        if where.shape != self.shape:
            raise ValueError(f"where= is a (rows, cols) bool array over this tile's cores {self.shape}, got "
                             f"shape {where.shape}")
        rows, cols = np.nonzero(where)
        return [Coord(self.local.x0 + int(c), self.local.y0 + int(r)) for r, c in zip(rows, cols)]

    def _comm(self, axis: str) -> tuple[LineComm, int]:
        if axis == "x":
            return self.x, 1
        if axis == "y":
            return self.y, 0
        raise ValueError(f"mesh axis is 'x' (along rows, E/W) or 'y' (along columns, N/S), got {axis!r}")

    def _check(self, buf: np.ndarray) -> None:
        if buf.shape[:2] != self.shape:
            raise ValueError(f"kernel arrays start with this tile's core axes {self.shape}, got {buf.shape}")

    # -- primitives -----------------------------------------------------------------------------------
    def send(self, buf: np.ndarray, dx: int, dy: int, where=None) -> np.ndarray:
        """Every core (or only those where `where`, a (rows, cols) bool array, holds) sends its block to the
        core at (x+dx, y+dy), which must be a neighbour; returns what each core received (zeros where no
        core of the region sent to it). Booked: one message per core that sends."""
        if abs(dx) + abs(dy) != 1:
            a = Coord(self.local.x0, self.local.y0)
            b = Coord(a.x + dx, a.y + dy)
            raise NotNeighbourError(
                f"core {a} cannot send to core {b}: they are {a.hops_to(b)} hops apart and a core has links "
                "only to its N/E/S/W neighbours. Move data one hop at a time (ctx.send with |dx|+|dy| = 1), "
                "or use ctx.shift / ctx.broadcast / ctx.allreduce, which forward hop by hop."
            )
        self._check(buf)
        axis, dist = ("x", dx) if dx else ("y", dy)
        d, senders = Dir.of_step(dx, dy), None
        if where is None:
            self._need(f"ctx.send {d.name}", axis=axis)
        else:
            chosen = [c for c in self._chosen(where) if self.region.contains(c.step(d))]
            self._need(f"ctx.send {d.name} (where=)", chosen + [c.step(d) for c in chosen],
                       links=[(c, c.step(d)) for c in chosen])
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

    def shift(self, buf: np.ndarray, axis: str, dist: int = 1, wrap: bool = False) -> np.ndarray:
        self._check(buf)
        comm, ax = self._comm(axis)
        self._need(f"ctx.shift along {axis}", axis=axis)
        return comm.shift(buf, dist, wrap, ax)

    def broadcast(self, buf: np.ndarray, axis: str, root: int = 0) -> np.ndarray:
        self._check(buf)
        comm, ax = self._comm(axis)
        self._need(f"ctx.broadcast along {axis}", axis=axis)
        return comm.broadcast(buf, root, ax)

    def allreduce(self, buf: np.ndarray, axis: str, algo: str = "ktree", k: int = 2, op: str = "sum"
                  ) -> np.ndarray:
        """Every core ends with the reduction ("sum" or "max") of the blocks of its line along `axis` ("x":
        its row of cores, "y": its column), by the `algo` allreduce ("ktree" with `k` levels, "ring",
        "pipeline"), hop by hop, booked as ``allreduce.<algo>``.

        >>> import numpy as np
        >>> from waferrt.core.mesh import MeshSpec
        >>> from waferrt.core.spec import TINY
        >>> from waferrt.fabric.loop import simulate
        >>> mesh = MeshSpec(4, 2, 2, 2)                      # 4x2 cores in two tiles of 2x2
        >>> x = np.arange(8, dtype=np.float32).reshape(2, 4, 1)  # (rows, cols, block): one value per core
        >>> out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, x: ctx.allreduce(x, "x"), x=x)
        >>> out[..., 0]
        array([[ 6.,  6.,  6.,  6.],
               [22., 22., 22., 22.]], dtype=float32)
        >>> cost["allreduce.ktree"].hops                     # to the roots (1 + 2 hops), multicast (3)
        6
        """
        self._check(buf)
        comm, ax = self._comm(axis)
        self._need(f"ctx.allreduce along {axis}", axis=axis)
        return comm.allreduce(buf, algo, k, op, ax)

    def gemv(self, w: np.ndarray, x: np.ndarray, axis: str, algo: str = "ktree", k: int = 2) -> np.ndarray:
        """MeshGEMV. w: (rows, cols, out_b, in_b) blocks; x: (rows, cols, in_b), the input split along
        `axis` (and replicated along the other). Each core computes w @ x on its block, then the partial
        sums are allreduced along `axis`: the output (rows, cols, out_b) is split along the other axis."""
        self._check(w)
        self._check(x)
        self._comm(axis)
        self._need(f"ctx.gemv along {axis}", axis=axis)
        with self.ledger.op("gemv"):
            y = np.matmul(w, x[..., None])[..., 0]
            self.ledger.compute(2 * w.shape[-1] * w.shape[-2])
            comm, ax = self._comm(axis)
            return comm.allreduce(y, algo, k, "sum", ax)

    def compute(self, flops: int) -> None:
        with self.ledger.op("compute"):
            self.ledger.compute(flops)

    # -- DSM ------------------------------------------------------------------------------------------
    def load(self, name: str, where=None) -> np.ndarray:
        """This tile's blocks of DSM tensor `name` that lie in the kernel's region: (rows, cols, *block).
        With `where` ((rows, cols) bool), only those cores read theirs; the others' blocks are zeros."""
        layout, blocks = self._dsm(name)
        mine = blocks[self._window(layout.region)]
        if where is None:
            self._need(f"ctx.load of {name!r}")
            return mine
        self._need(f"ctx.load of {name!r} (where=)", self._chosen(where))
        return np.where(self._spread(where, mine), mine, np.zeros((), mine.dtype))

    def store(self, name: str, value: np.ndarray, where=None) -> None:
        """Write this tile's blocks of `name` (only those of the cores where `where` holds, if given)."""
        layout, blocks = self._dsm(name)
        win = self._window(layout.region)
        if value.shape != blocks[win].shape:
            raise ValueError(f"storing {value.shape} into {name!r}, whose blocks here are {blocks[win].shape}")
        if where is None:
            self._need(f"ctx.store into {name!r}")
            blocks[win] = value
            return
        self._need(f"ctx.store into {name!r} (where=)", self._chosen(where))
        blocks[win] = np.where(self._spread(where, value), value, blocks[win])

    def _spread(self, where, like: np.ndarray) -> np.ndarray:
        """`where` ((rows, cols) bool) shaped to broadcast over the blocks of `like`."""
        return np.reshape(np.asarray(where, bool), self.shape + (1,) * (like.ndim - 2))

    def _dsm(self, name: str):
        try:
            return self._store[name]
        except KeyError:
            raise KeyError(f"no DSM tensor {name!r} on this tile; allocate it with wafer.dsm.alloc") from None

    def _window(self, tensor_region: Region) -> tuple[slice, slice]:
        """The kernel's local cores as a window into the tensor's blocks on this tile (the tensor's region
        must cover the kernel's cores here)."""
        t_local = tensor_region.intersect(self.tile)
        if t_local is None or not t_local.covers(self.local):
            raise ValueError(f"the kernel's region {self.region} is not inside the tensor's region {tensor_region}")
        return t_local.window(self.local)
