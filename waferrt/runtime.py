"""The public Wafer: an emulated mesh of cores as Ray tile actors, its DSM, kernels and costs.

Contract: ``Wafer(spec, mesh, tile, backend, launch)`` is a context manager (``launch``: a :class:`Launch` of
the Ray address, a tile's timeout and the most tiles); its arguments are checked when it is made (before Ray
starts): a mesh wider or taller than the spec's wafer is ``MeshTooLarge``, more than `launch.max_tiles` tiles
(256: each is a Ray worker process) ``TooManyTiles``. Entering
starts (``address=None``) or joins (``address="auto"`` or a Ray address, first checked with a deadline:
:class:`ClusterUnreachable` names the address and how to start a cluster) Ray, starts one actor per tile
(``tile(x,y)``) and wires the neighbour fabric; leaving -- also on an exception or Ctrl-C -- kills the
actors, removes the fabric's socket files (a ``waferrt-<pid>-*`` directory; the next Wafer removes those
whose process died without closing) and, if this Wafer started Ray, stops it. A closed Wafer raises
:class:`WaferClosed` when used, and opens again. ``wafer.dsm`` holds named distributed tensors (misuse -- a
bad shape, data of another dtype or shape, an unknown name -- is a TypeError, ValueError or
:class:`UnknownTensor` naming the argument); ``wafer.run(kernel, region, **args)`` runs an SPMD kernel (one
command per tile; the tiles exchange with each other directly) and returns its cost; ``wafer.cost()`` sums
every run so far; ``with wafer.trace(path):`` writes a Perfetto trace of the runs inside. Once a fault was
injected (``wafer.inject``, ``wafer.faults``), every run first lets the faults due fire on its tiles and
hands every tile the region's fault map (``ctx.dead_cores``; a primitive that needs a dead core or link
raises CoreFailed / LinkFailed); ``wafer.fault_map()`` is what is dead; a dead core's DSM blocks are lost
(``dsm.get`` and ``dsm.read`` raise naming them; ``dsm.get(name, fill=np.nan)`` reads the rest). Ray's own
messages to the driver ("(raylet) A worker died ...") go to the ``waferrt.ray`` logger, not to stdout.
``backend="local"`` runs the same tiles (waferrt.localtiles) in this process over queues instead: no Ray, the
same results and costs, for fast tests (a TileCrash or NodeLoss needs Ray)."""

from __future__ import annotations

import atexit
import math
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from waferrt.actors.session import ClusterUnreachable, cluster_nodes, new_ipc_dir, ray_init
from waferrt.actors.tile import Tile

from .core.cost import Cost, CostReport
from .core.ledger import merge_snapshots
from .core.mesh import DEFAULT_MAX_TILES, Extent, MeshSpec, Region, TileId, check_on_wafer, check_tile_count
from .core.spec import HardwareSpec, spec_by_name
from .dsm import DSM, UnknownTensor
from .fabric.host_args import check_host_args, unknown_keywords
from .fabric.misuse import TileHung
from .fabric.spmd import root_cause, show_output
from .faults.errors import FaultError
from .localtiles import check_backend
from .wafer_faults import WaferFaults

STALL_S = 4.0  # a tile that sends no heartbeat for this long is dead or frozen (it beats every 0.25 s)
DEFAULT_MESH, DEFAULT_TILE = Extent(16, 16), Extent(8, 8)  # a Wafer's cores and its tiles' unless told

__all__ = ["ClusterUnreachable", "CostReport", "DSM", "Launch", "UnknownTensor", "Wafer", "WaferClosed",
           "cluster_nodes", "ray_init"]


@dataclass(frozen=True)
class Launch:
    """How a Wafer's tiles are started: the Ray to start them on (None: a new one in this process; "auto" or
    HOST:PORT: a running cluster), the seconds a tile waits for a neighbour, and the most tile actors allowed
    (each is a Ray worker process)."""

    address: str | None = None
    timeout: float = 30.0
    max_tiles: int = DEFAULT_MAX_TILES

    def __post_init__(self) -> None:
        t = self.timeout
        if not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise ValueError(f"timeout is the seconds a tile waits for a neighbour, a number > 0; got {t!r}")
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(f"address is a str ('auto' or HOST:PORT) or None, got {self.address!r}")


class WaferClosed(RuntimeError):
    """The Wafer was used while it is not open (closed, or not opened yet)."""


class Wafer(WaferFaults):
    """An emulated mesh of cores as Ray tile actors: its DSM (``wafer.dsm``), SPMD kernels (``wafer.run``)
    and what they would cost on the modelled wafer (``wafer.cost()``).

    >>> import numpy as np
    >>> import waferrt
    >>> with waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2)) as wafer:   # 4x2 cores, two tile actors
    ...     _ = wafer.dsm.alloc("x", (2, 4))                                   # one value per core
    ...     wafer.dsm.put("x", np.arange(8, dtype=np.float32).reshape(2, 4))
    ...     cost = wafer.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))
    ...     wafer.dsm.get("x")
    array([[ 6.,  6.,  6.,  6.],
           [22., 22., 22., 22.]], dtype=float32)
    """

    def __init__(self, spec: str | HardwareSpec = "tiny", mesh: Extent | MeshSpec = DEFAULT_MESH,
                 tile: Extent = DEFAULT_TILE, backend: str = "ray", launch: Launch = Launch(), **unknown):
        """`mesh` and `tile` are sizes in cores; a plain (width, height) tuple, as the docs write them, converts
        here, once (or `mesh` is a whole MeshSpec, its tiles included)."""
        if unknown:
            raise TypeError(unknown_keywords(unknown, Launch))
        self.backend = check_backend(backend)
        self.spec = spec_by_name(spec)
        self.mesh = mesh if isinstance(mesh, MeshSpec) else _mesh_spec(_extent("mesh", mesh), _extent("tile", tile))
        check_on_wafer(self.mesh, self.spec)
        if not isinstance(launch, Launch):
            raise TypeError(f"launch is a waferrt.Launch(address, timeout, max_tiles), got {launch!r}")
        check_tile_count(self.mesh, launch.max_tiles)
        self.address, self.timeout = launch.address, launch.timeout
        self.tiles: dict[TileId, object] = {}
        self.dsm = DSM(self)
        self._costs: list[dict] = []
        self._epoch = 0
        self._started_ray = False
        self._ipc_dir: str | None = None
        self._open = self._closed = False
        self.watch = None  # the tiles' liveness and their line to the host (waferrt.actors.watch)
        self._local: frozenset[TileId] = frozenset()
        self.failed: Exception | None = None  # a tile died or froze: nothing more runs until it is restarted
        self.nodes: dict[TileId, str] = {}  # the Ray node of every tile
        self.lost: set[str] = set()  # the Ray nodes this wafer lost (NodeLoss): nothing runs there again
        self.session = None  # the faults armed on this wafer (waferrt.inject.FaultSession)
        self._trace = None  # the host's Recorder inside `with wafer.trace(path):`

    def __enter__(self) -> Wafer:
        return self if self._open else self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, progress=None, node_ids: dict[TileId, str] | None = None) -> Wafer:
        """Start (or join) Ray and the tile actors: each tile on its node in `node_ids` (default: this
        driver's node), the fabric wired, and every tile beating to this host's inbox."""
        if self._open:
            raise RuntimeError("this Wafer is already open; close it before opening it again")
        if self.backend == "local":
            return self._open_local()
        from waferrt.actors.pool import keep_limit
        from waferrt.actors.remote import TileLaunch, driver_node, start_tiles
        from waferrt.actors.stream import HostInbox
        from waferrt.actors.watch import Watch

        keep_limit()  # a bad WAFERRT_KEEP_TILES is refused before Ray starts
        self._started_ray = ray_init(self.address)
        self._open, self.failed, self.lost = True, None, set()
        atexit.register(self.close)
        self._ipc_dir = new_ipc_dir()
        self._namespace = namespace = f"waferrt-{uuid.uuid4().hex[:8]}"
        try:
            self._here = here = driver_node()
            self.nodes = nodes = {t: (node_ids or {}).get(t) or here for t in self.mesh.tiles()}
            inbox = HostInbox(self._ipc_dir, tcp=any(n != here for n in nodes.values()))
            self.watch = Watch({}, inbox, STALL_S)  # so that close() closes the inbox if the tiles fail to start
            self.tiles = start_tiles(TileLaunch(self.mesh, self.spec, namespace, self._ipc_dir, nodes, self.timeout,
                                                inbox.addresses), progress)
            self.watch = Watch(self.tiles, inbox, STALL_S)
            self._local = self.watch.local(sorted(self.tiles))  # on this machine, whichever Ray node
        except BaseException:
            self.close()
            raise
        return self

    def _open_local(self) -> Wafer:
        """The tiles in this process (waferrt.localtiles): no Ray, no sockets, no heartbeats."""
        from .localtiles import LocalTiles

        self._local_tiles = LocalTiles(self.mesh, self.spec, self.timeout)
        self.tiles, self._here = self._local_tiles.tiles, "local"
        self.nodes = {t: "local" for t in self.tiles}
        self._local = frozenset(self.tiles)
        self._open, self.failed, self.lost = True, None, set()
        return self

    def live(self) -> None:
        """Raise :class:`WaferClosed` unless the Wafer is open."""
        if not self._open:
            state = "is closed; open it again" if self._closed else "is not open yet; open it"
            raise WaferClosed(f"this Wafer {state} with `with wafer:` or wafer.open()")

    def region_of(self, region: Region | None) -> Region:
        """`region` (default: the whole mesh), checked to be a Region inside the mesh."""
        if region is None:
            return self.mesh.region
        if not isinstance(region, Region):
            raise TypeError(f"region must be a waferrt.Region(x0, y0, w, h), got {region!r}")
        if not self.mesh.region.covers(region):
            raise ValueError(f"region {region} is outside the {self.mesh.width}x{self.mesh.height} mesh")
        return region

    def run(self, kernel, region: Region | None = None, **args) -> dict[str, Cost]:
        """Run ``kernel(ctx, **args)`` on every core of `region` (default: the whole mesh): one command per
        tile; tiles exchange with their neighbours by themselves. Returns the cost per primitive. What the
        kernel prints (or ``ctx.log`` s) is printed here, each line labelled by its tile; an error is the
        tile's own (not a neighbour's timeout), with a note naming the kernel's line and the tile (its
        ``kernel_site``, ``tile`` and ``core`` attributes)."""
        if not callable(kernel):
            raise TypeError(f"kernel must be a function kernel(ctx, **args), got {kernel!r}")
        region = self.region_of(region)
        check_host_args(args)
        self.live()
        if self.backend == "ray":
            _ship_code(kernel)
        tiles = self.mesh.tiles_of(region)
        epoch = self.next_epoch()
        name = getattr(kernel, "__name__", type(kernel).__name__)
        with nullcontext() if self._trace is None else self._trace.span(f"run {name}", "host", epoch=epoch):
            try:
                faults = None if self.session is None else self.session.kernel_faults(tiles, epoch)
                runs, errors = self.gather([(t, Tile.run, (kernel, region, args, epoch, faults)) for t in tiles],
                                           settle=self.timeout)
            except RuntimeError as e:
                from waferrt.actors.watch import TileDied

                if isinstance(e, TileDied) and self.session is not None:  # a TileCrash armed on it fired
                    self.session.tile_died(e, epoch)
                raise
        show_output([(t, r["output"] if r else getattr(errors.get(i), "output", ""))
                     for i, (t, r) in enumerate(zip(tiles, runs))])
        if errors:
            error = root_cause(errors)
            if isinstance(error, FaultError) and self.session is not None:
                self.session.kernel_error(error)
            raise error
        self._costs.append(merge_snapshots([r["cost"] for r in runs]))
        return self._costs[-1]

    def fault_map(self):
        """What is dead on the wafer now (waferrt.faults.faultmap.FaultMap: cores, links, the DSM blocks each
        dead core lost), from every tile."""
        from .faults.faultmap import FaultMap

        return FaultMap.join(self.on_every_tile(Tile.dead))

    @contextmanager
    def trace(self, path: str | Path):
        """Record every kernel run inside the block and write a Chrome / Perfetto trace to `path` at its end
        (ui.perfetto.dev opens it): the host's track (a span per ``wafer.run``) and one track per tile
        (the kernel, each primitive it ran, each send and each wait on a neighbour, and an arrow from each send
        to the wait on the neighbour tile that took it; waferrt.core.trace). examples/custom_kernel.py shows it.

        """
        from .core.trace import Recorder, wall_process, write_trace

        self.live()
        if self._trace is not None:
            raise RuntimeError("this Wafer is already tracing; one `with wafer.trace(path):` at a time")
        origin, self._trace = time.time_ns(), Recorder("host")
        self.on_every_tile(Tile.trace_start)
        try:
            yield self._trace
        finally:
            host, self._trace = self._trace, None
            tiles = (self.on_every_tile(Tile.trace_stop) if self._open and self.failed is None
                     else [[] for _ in self.tiles])
            write_trace(path, [wall_process(host, {str(t): evs for t, evs in zip(self.tiles, tiles)}, origin)],
                        {"mesh": str(self.mesh), "spec": self.spec.name})

    def call(self, calls: list[tuple[TileId, Callable, tuple]], progress=None, within: float | None = None) -> list:
        """Call tile methods side by side, one Ray call each: (tile, a :class:`Tile` method such as
        ``Tile.decode_start``, args) -> results, in order. Every call is waited for, with the tiles'
        liveness checked all along (a dead tile raises TileDied, a frozen one TileStalled, within
        seconds); when calls fail, the root cause is raised (a tile's own error, not the timeout of a
        neighbour that waited for it). ``progress(done, total)`` after every call that ends. `within`: a
        tile that is alive but has not finished its call after that many seconds raises TileStalled."""
        self.live()
        results, errors = self.gather(calls, progress, within)
        if errors:
            raise root_cause(errors)
        return results

    def gather(self, calls: list[tuple[TileId, Callable, tuple]], progress=None, within: float | None = None,
               settle: float | None = None) -> tuple[list, dict[int, BaseException]]:
        """Like :meth:`call`, but returns (results, {index: error}) instead of raising a tile's error. Once a
        call failed, the others have `settle` seconds to end; a tile still running then is stuck for good
        (TileHung, its error; nothing more runs on this wafer until it is opened again)."""
        if self.failed is not None:
            raise self.failed
        if self.backend == "local":
            results, errors = self._local_tiles.gather(calls, settle)
        else:
            from waferrt.actors.watch import TileFailed

            refs = [getattr(self.tiles[t], method.__name__).remote(*args) for t, method, args in calls]
            try:
                results, errors = self.watch.gather(refs, [t for t, _, _ in calls], progress, within,
                                                    [m.__name__ for _, m, _ in calls], settle)
            except TileFailed as e:
                self.failed = e
                raise
        self.failed = next((e for e in errors.values() if isinstance(e, TileHung)), None)
        return results, errors

    def local_tiles(self) -> frozenset[TileId]:
        """The tiles on this driver's machine, run by its user (on any Ray node): they map its files."""
        return self._local

    def listen(self, timeout: float) -> list[dict]:
        """What the tiles sent the host within `timeout` (events, errors), with their liveness checked."""
        from waferrt.actors.watch import TileFailed

        if self.failed is not None:
            raise self.failed
        try:
            msgs = self.watch.listen(timeout)
            self.watch.check()
        except TileFailed as e:
            self.failed = e
            raise
        return msgs

    def on_every_tile(self, method: Callable, *args) -> list:
        """The same call on every tile (mesh order); their results."""
        self.live()
        return self.call([(t, method, args) for t in self.tiles])

    def next_epoch(self) -> int:
        """A new number for the next command to the tiles: their messages are tagged with it, and a tile
        drops what is left on its links from an earlier, failed command."""
        self._epoch += 1
        return self._epoch

    def cost(self) -> CostReport:
        by_op: dict[str, Cost] = {}
        for step in self._costs:
            for name, c in step.items():
                by_op[name] = by_op.get(name, Cost()) + c
        return CostReport(self.spec, by_op, tuple(self._costs))

    def sram(self) -> list[dict]:
        return self.on_every_tile(Tile.sram_stats)

    def close(self) -> None:
        if not self._open:
            return
        self._open, self._closed = False, True
        atexit.unregister(self.close)
        self.dsm.layouts.clear()  # the tensors lived in the tiles
        try:
            if self.tiles and self.backend == "ray":
                from waferrt.actors.remote import stop_tiles

                keep = None if self._started_ray else self.nodes  # a Ray it stops keeps nothing (actors.pool)
                stop_tiles(self.tiles, patience=2.0 if self.failed is not None else 10.0, nodes=keep)
        finally:
            self.tiles = {}
            if self.watch is not None:
                self.watch.inbox.close()
                self.watch = None
            if self._ipc_dir:
                shutil.rmtree(self._ipc_dir, ignore_errors=True)
                self._ipc_dir = None
            if self._started_ray:
                import ray

                ray.shutdown()
                self._started_ray = False


def _ship_code(kernel) -> None:
    """The tiles' processes may not import the module a kernel comes from (a test file, a module next to a
    script): its code travels with the kernel (by value), as a script's own (``__main__``) does. Modules of
    installed packages and of waferrt are imported there as usual."""
    module = sys.modules.get(getattr(kernel, "__module__", None) or "")
    path = getattr(module, "__file__", None) or ""
    if module is None or module.__name__.split(".")[0] in ("__main__", "waferrt") or "-packages" in path:
        return
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)


def _extent(what: str, value) -> Extent:
    """`value` -- an Extent, or a plain (width, height) tuple -- as an Extent; a TypeError naming `what` when it is
    not a pair of whole numbers."""
    try:
        return Extent(*value)
    except TypeError as e:  # not a pair, or not whole numbers
        raise TypeError(f"{what} is a (width, height) pair of core counts, e.g. (8, 8); got {value!r} ({e})") from None


def _mesh_spec(mesh: Extent, tile: Extent) -> MeshSpec:
    return MeshSpec(mesh.width, mesh.height, tile.width, tile.height)
