"""The tiles of a Ray-free wafer: ``Wafer(..., backend="local")`` runs them in this process.

Contract: :class:`LocalTiles` holds one plain :class:`~waferrt.tiles.TileCores` per tile of the mesh -- the
class the Ray actors' Tile extends, so a kernel, the DSM, SRAM bookings, faults and costs behave and count
exactly as on Ray -- linked by an in-process :class:`~waferrt.fabric.loop.LoopFabric` (queues; a fresh one
for every command, so nothing a failed command left behind reaches the next). ``gather(calls)`` runs
each call in a thread of its own (the tiles of a kernel exchange with each other while they run) and
returns (results, {index: error}), as the Ray tiles' ``Watch.gather`` does. No Ray, no sockets, no
processes: faults that end a process (``TileCrash``, ``NodeLoss``) need ``backend="ray"``
(:func:`check_fault`).
"""

from __future__ import annotations

import threading
import time

from waferrt.core.mesh import MeshSpec
from waferrt.fabric.loop import LoopFabric
from waferrt.fabric.misuse import TileHung
from waferrt.faults.model import NodeLoss, TileCrash
from waferrt.tiles import TileCores

BACKENDS = ("ray", "local")


def check_backend(backend) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend is 'ray' (tile actors on Ray) or 'local' (the tiles in this process, no Ray), "
                         f"got {backend!r}")
    return backend


def check_fault(fault) -> None:
    """A local wafer's tiles share this process: a fault that ends a process would end it."""
    if isinstance(fault, (TileCrash, NodeLoss)):
        raise ValueError(f"{type(fault).__name__} ends a tile's process (or a whole Ray node): a local wafer's tiles "
                         "are threads of this process; use Wafer(..., backend='ray') for it")


class LocalTiles:
    """Every tile of `mesh` as a plain TileCores in this process, linked by queues."""

    def __init__(self, mesh: MeshSpec, spec, timeout: float):
        self.mesh, self.timeout = mesh, timeout
        self.tiles = {t: TileCores(mesh, spec, t, timeout) for t in mesh.tiles()}
        self.hung: TileHung | None = None  # a tile's thread still runs a command that never ended

    def gather(self, calls: list, settle: float | None = None) -> tuple[list, dict[int, BaseException]]:
        """(tile, TileCores method, args) each in a thread of its own: (results, {index: error}). Once a call failed,
        the others have `settle` seconds (None: no limit) to end; one still running then (stuck in a kernel's
        own code: a thread cannot be stopped) is left running, its error a :class:`TileHung`, and the tiles
        are unusable (``hung``)."""
        fabric = LoopFabric(self.mesh, self.timeout)
        for t, tile in self.tiles.items():
            tile.links = fabric.links(t)
            tile.links.corrupt = tile.faults.on_send  # a Corrupt fault flips bits on the way, as on Ray
        results, errors = [None] * len(calls), {}

        def body(i: int) -> None:
            t, method, args = calls[i]
            try:
                results[i] = method(self.tiles[t], *args)
            except BaseException as e:  # noqa: BLE001 - returned to the caller, as a tile actor's error is
                errors[i] = e

        threads = [threading.Thread(target=body, args=(i,), name=str(calls[i][0]), daemon=True)
                   for i in range(len(calls))]
        for th in threads:
            th.start()
        _join(threads, errors, settle)
        for i, th in enumerate(threads):
            if th.is_alive():
                errors[i] = self.hung = TileHung(
                    f"{calls[i][0]} did not finish its command within {settle:g} s after another tile's failed: it "
                    "is stuck in the kernel's own code (a loop or a wait that never ends) or never reaches the "
                    "primitive its neighbours waited at; this local wafer's tiles are unusable now (a thread "
                    "cannot be stopped): close it and open a new one")
                errors[i].tile = errors[i].blame = calls[i][0]
        return results, errors


def _join(threads: list[threading.Thread], errors: dict, settle: float | None) -> None:
    """Wait for every thread; once `errors` has one, at most `settle` seconds more."""
    end = None
    for th in threads:
        while th.is_alive():
            if end is None and errors and settle is not None:
                end = time.monotonic() + settle
            th.join(0.05 if end is None else max(0.0, min(0.05, end - time.monotonic())))
            if end is not None and time.monotonic() >= end:
                return
