"""An in-process fabric: tiles as threads, links as queues. For running SPMD tile programs without Ray.

Contract: :class:`LoopFabric` gives every tile of a :class:`~waferrt.core.mesh.MeshSpec` a ``Links`` object
(``send(dir, tag, arrays)`` / ``recv(dir, tag)``) whose messages go to the neighbour tile in that direction
through a ``queue.Queue``; arrays are copied on send (no shared buffers, as over a socket), tags are checked,
every payload's checksum is checked on receipt (a mismatch -- a Corrupt fault's bit flips, ``corrupt`` hook --
is :class:`~waferrt.faults.errors.PayloadCorrupt`, raised by that link's recv), messages are numbered per link
(``sent`` / ``taken``), and a receive that waits
longer than ``timeout`` raises :class:`FabricTimeout` naming the link. ``run_spmd(fn)`` runs ``fn(tile_id,
links)`` on every tile in its own thread and returns the results (re-raising the first error, or returning the
errors too). It implements
waferrt.fabric.links.Links, as the real fabric (pyzmq between Ray actors, waferrt.actors.fabric) does."""

from __future__ import annotations

import collections
import queue
import threading
import time

import numpy as np

from waferrt.core.ledger import Ledger, merge_snapshots
from waferrt.core.mesh import Dir, MeshSpec, TileId
from waferrt.faults.errors import PayloadCorrupt
from waferrt.faults.wire import checksum, flip

from .comm import Span
from .kernel import Context
from .links import FabricProtocolError, FabricTimeout, TagMismatch
from .spmd import root_cause, run_kernel, show_output


class LoopLinks:
    """One tile's links: sends go into the neighbour's inbox; what arrives waits here per link, in order."""

    def __init__(self, fabric: LoopFabric, tile: TileId):
        self.fabric, self.tile = fabric, tile
        self.inbox: queue.Queue = fabric.inboxes[tile]
        self.pending: dict[Dir, collections.deque] = {d: collections.deque() for d in Dir}
        self.arrived = 0
        self.sent = collections.Counter()  # per link: the sequence number of the latest message sent
        self.taken = collections.Counter()  # per link: that of the message recv/recv_any returned last
        self.corrupt = None  # fault injection: FaultState.on_send, the bits to flip on a link (on the wire)

    def send(self, d: Dir, tag: str, arrays: list[np.ndarray]) -> None:
        peer = self.fabric.mesh.tile_neighbour(self.tile, d)
        if peer is None:
            raise FabricProtocolError(f"{self.tile} has no neighbour tile to the {d.name}")
        arrays = [np.array(a, copy=True) for a in arrays]
        crc = checksum(arrays)
        if self.corrupt is not None and any(a.nbytes for a in arrays) and (flips := self.corrupt(d)):
            arrays = flip(arrays, *flips)
        self.sent[d] += 1
        self.fabric.inboxes[peer].put((d.opposite, tag, arrays, crc, self.sent[d]))

    def recv(self, d: Dir, tag: str) -> list[np.ndarray]:
        deadline = time.monotonic() + self.fabric.timeout
        while not self.pending[d]:
            if not self._take(deadline):
                peer = self.fabric.mesh.tile_neighbour(self.tile, d)
                raise FabricTimeout(f"{self.tile} waited {self.fabric.timeout}s for message {tag!r} from {peer} "
                                    f"({d.name} link) and got nothing", self.tile, d)
        got_tag, arrays, _, self.taken[d] = self.pending[d].popleft()
        if isinstance(arrays, Exception):
            raise arrays
        if got_tag != tag:
            raise TagMismatch(self.tile, d, tag, got_tag, arrays)
        return arrays

    def recv_any(self, timeout: float) -> tuple[Dir, str, list[np.ndarray]] | None:
        deadline = time.monotonic() + timeout
        while not (links := [d for d in Dir if self.pending[d]]):
            if not self._take(deadline):
                return None
        d = min(links, key=lambda d: self.pending[d][0][2])
        tag, arrays, _, self.taken[d] = self.pending[d].popleft()
        if isinstance(arrays, Exception):
            raise arrays
        return d, tag, arrays

    def _take(self, deadline: float) -> bool:
        """Move one message from the inbox to its link's queue, waiting until `deadline`."""
        try:
            d, tag, arrays, crc, seq = self.inbox.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            return False
        if checksum(arrays) != crc:  # flipped on the way: never used, raised by the recv of its link
            sender = self.fabric.mesh.tile_neighbour(self.tile, d)
            arrays = PayloadCorrupt(self.tile, sender, d.name, f"message {tag!r}")
        self.arrived += 1
        self.pending[d].append((tag, arrays, self.arrived, seq))
        return True


class LoopFabric:
    def __init__(self, mesh: MeshSpec, timeout: float = 10.0):
        self.mesh, self.timeout = mesh, timeout
        self.inboxes = {t: queue.Queue() for t in mesh.tiles()}
        self._links: dict[TileId, LoopLinks] = {}

    def links(self, tile: TileId) -> LoopLinks:
        """The links of `tile` (one object per tile: what arrived for it waits there)."""
        if tile not in self._links:
            self._links[tile] = LoopLinks(self, tile)
        return self._links[tile]

    def run_spmd(self, fn, tiles: list[TileId] | None = None, raise_first: bool = True):
        """``fn(tile, links)`` on every tile, each in its own thread: {tile: result}. An error is re-raised (the
        first); with ``raise_first=False``, returns ({tile: result}, {tile: error}) instead."""
        tiles = self.mesh.tiles() if tiles is None else tiles
        results: dict[TileId, object] = {}
        errors: dict[TileId, BaseException] = {}

        def body(t: TileId) -> None:
            try:
                results[t] = fn(t, self.links(t))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors[t] = e

        threads = [threading.Thread(target=body, args=(t,), name=str(t)) for t in tiles]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if not raise_first:
            return results, errors
        if errors:
            raise next(iter(errors.values()))
        return results


def simulate(mesh: MeshSpec, spec, region, kernel, timeout: float = 10.0, faults=None, **arrays):
    """Run ``kernel(ctx, **arrays)`` SPMD over `region` without Ray: one thread per tile, queues as links.

    Every array is given for the whole region, (h, w, *block); each tile's kernel gets its own cores'
    part. Returns (output for the whole region, merged cost per primitive): here a kernel returns one array
    over its local cores (a ``wafer.run`` kernel returns nothing). What the kernel prints is printed labelled
    by tile; an error is the one that caused the others, with the kernel's line and the tile
    (waferrt.fabric.spmd). `faults` (a waferrt.faults.faultmap.FaultMap) is what is dead, as ``wafer.run``
    hands it to every tile once faults were injected."""
    fabric = LoopFabric(mesh, timeout)
    tiles = mesh.tiles_of(region)

    def body(t: TileId, links):
        local = mesh.tile_region(t).intersect(region)
        ledger = Ledger(spec)
        ctx = Context(Span(region, mesh.tile_region(t), links, mesh.region), ledger, store={}, tag="sim",
                      faults=faults)
        part = {k: v[region.window(local)] for k, v in arrays.items()}
        value, printed = run_kernel(ctx, kernel, part, t, returns=True)
        return local, value, ledger.snapshot(), printed

    results, errors = fabric.run_spmd(body, tiles, raise_first=False)
    show_output([(t, results[t][3] if t in results else errors[t].output) for t in tiles])
    if errors:
        raise root_cause({tiles.index(t): e for t, e in errors.items()})
    first = next(iter(results.values()))[1]
    out = np.zeros(region.shape + first.shape[2:], first.dtype)
    for local, value, _, _ in results.values():
        out[region.window(local)] = value
    return out, merge_snapshots([s for _, _, s, _ in results.values()])
