"""Faults into a running wafer: each fault to the tiles that carry it out, node losses by the host, the log.

Contract: a :class:`FaultSession` belongs to one open Wafer (``wafer.faults(plan)`` or the session that
``wafer.inject`` opens). ``inject(fault)`` arms a fault on the tiles it concerns
(waferrt.faults.model.fault_tiles; a CoreFailure's or LinkFailure's position is checked to be on the mesh)
and adds it to ``log`` (waferrt.faults.events.FaultLog); entering the session arms every fault of its plan,
leaving it disarms what has not fired (what died stays dead). A :class:`~waferrt.faults.model.NodeLoss` is
the host's to carry out: ``tick(step)`` fires it when its trigger holds (the host's step is the number of
tokens it has received): ``node_loss(i)`` removes Ray node i (e.g. a ray.cluster_utils.Cluster's
``remove_node``; i counts ``nodes``: a placement's, or ``Wafer.node_list()``, the driver's first), then the
session ends that node's tiles and fails the wafer with NodeLost (the decode recovers from it). A NodeLoss of the
driver's own node is never carried out (it would take the host down with it): it raises
:class:`~waferrt.faults.errors.Unrecoverable` saying so.
``on_message`` takes the tiles' reports of faults that fired, ``refresh()`` asks every tile what fired on
it; ``rearm(tiles)`` arms again, on restarted tiles, the faults that had not fired there. For kernels,
``kernel_faults(tiles, epoch)`` lets the faults due fire as a command starts and returns the fault map every
tile of it gets; ``kernel_error(e)`` marks the faults a kernel's CoreFailed / LinkFailed / PayloadCorrupt
found as detected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from waferrt.actors.tile import Tile
from waferrt.core.mesh import TileId
from waferrt.faults.errors import CoreFailed, LinkFailed, PayloadCorrupt, Unrecoverable
from waferrt.faults.events import FaultLog
from waferrt.faults.faultmap import FaultMap
from waferrt.faults.model import (
    FaultKind,
    FaultPlan,
    NodeLoss,
    Straggler,
    TileCrash,
    check_on_mesh,
    fault_dict,
    fault_tiles,
)


class FaultSession:
    def __init__(self, wafer, plan: FaultPlan | None = None, node_loss: Callable[[int], None] | None = None,
                 nodes: list[str] | None = None):
        self.wafer, self.plan = wafer, plan or FaultPlan()
        self.node_loss = node_loss
        self.nodes = list(nodes) if nodes else wafer.node_list()  # NodeLoss(i) loses the Ray node nodes[i]
        self.log = FaultLog()
        self.lost_nodes: set[int] = set()
        self._host: list[tuple[int, NodeLoss, float]] = []  # node losses armed: (index, fault, since)
        self.step = 0

    @property
    def policy(self) -> str:
        return self.plan.policy

    def __enter__(self) -> FaultSession:
        self.wafer.session = self
        for f in self.plan.faults:
            self.inject(f)
        return self

    def __exit__(self, *exc) -> None:
        if self.wafer.session is self:
            self.wafer.session = None
        if self.wafer.tiles and self.wafer.failed is None:
            self.wafer.on_every_tile(Tile.disarm)

    def inject(self, fault) -> int:
        check_on_mesh(fault, self.wafer.mesh)
        if isinstance(fault, NodeLoss):
            _check_node(fault, self.nodes, self.node_loss)
        i = self.log.add(fault, time.time())
        self._arm(i, fault)
        return i

    def _arm(self, i: int, fault) -> None:
        if isinstance(fault, NodeLoss):
            self._host.append((i, fault, time.monotonic()))
            self.tick(None)
            return
        self.wafer.call([(t, Tile.inject, (fault, i, self.plan.seed)) for t in fault_tiles(fault, self.wafer.mesh)])

    def rearm(self, tiles: list[TileId]) -> None:
        """Arm again, on these restarted tiles, the faults that had not fired."""
        again = [(t, Tile.inject, (e.fault, e.index, self.plan.seed)) for e in self.log.unfired()
                 if not isinstance(e.fault, NodeLoss) for t in fault_tiles(e.fault, self.wafer.mesh) if t in tiles]
        if again:
            self.wafer.call(again)

    def tick(self, step: int | None) -> None:
        """Fire the node losses whose trigger holds at the host's `step` (tokens received; None: timers)."""
        if step is not None:
            self.step = max(self.step, step)
        now = time.monotonic()
        for item in list(self._host):
            i, f, since = item
            w = f.when
            due = (not (w.step or w.seconds) or (w.step and self.step >= w.step)
                   or (w.seconds and now - since >= w.seconds))
            if due:
                self._host.remove(item)
                self.log.mark_fired(i, self.step, time.time())
                self._lose(i, f)

    def _lose(self, i: int, f: NodeLoss) -> None:
        """Carry out a NodeLoss that fired: remove the node, end its tiles (the wafer fails with NodeLost)."""
        node = self.nodes[f.node]
        if node == self.wafer.driver_node():
            raise Unrecoverable(
                f"{f.where()} ({node[:12]}) is this driver's own node: the host (the requests, the host's copy of "
                "the weights, the decode's state) would go with it and nothing of it is replicated, so the run "
                "cannot be recovered; the node was not removed (that would take this process down). A run "
                "survives the loss of the nodes that host only tiles: lose one of nodes "
                f"{', '.join(str(j) for j, n in enumerate(self.nodes) if n != node) or '(none: one node)'}")
        if f.node in self.lost_nodes:  # a second NodeLoss of one node: it is gone already
            return self._nothing_to_do(i, "none needed: the node was lost already")
        self.lost_nodes.add(f.node)
        self.node_loss(f.node)
        if not self._end_tiles(node, f"NodeLoss #{i}"):
            self._nothing_to_do(i, "none needed: no tile on that node")

    def _nothing_to_do(self, i: int, why: str) -> None:
        now = time.time()
        self.log.mark_detected([self.log.events[i]], "the host (it removed the node)", now)
        self.log.mark_recovered([self.log.events[i]], why, now)

    def _end_tiles(self, node: str, why: str) -> list[TileId]:
        """The Ray node `node` is gone: its tiles are ended now -- a lost machine takes its processes along,
        while Ray may take seconds to notice and a node that ray.cluster_utils removed leaves its workers
        running a moment -- and the wafer fails with NodeLost naming them (raised by its next call; the
        recovery restarts them elsewhere, never on a node in ``wafer.lost``). Returns them."""
        from waferrt.actors.remote import kill_tiles
        from waferrt.actors.watch import NodeLost

        w = self.wafer
        w.lost.add(node)
        gone = [t for t in w.tiles if w.nodes.get(t) == node]
        if gone:
            kill_tiles([w.tiles[t] for t in gone])
            also = f"; so were {', '.join(map(str, gone[1:]))}" if gone[1:] else ""
            w.failed = NodeLost(gone[0], f"was lost with its Ray node {node[:12]} ({why}){also}")
        return gone

    def on_message(self, msg: dict):
        """A tile's report that a fault fired on it: its event (None for a report of an earlier session's
        fault that was still on its way: its index or its fault is not this session's)."""
        i = msg["index"]
        if i >= len(self.log.events) or fault_dict(self.log.events[i].fault) != msg["fault"]:
            return None
        return self.log.mark_fired(i, msg["step"], msg["at"])

    def straggling(self, tiles: list[TileId]) -> None:
        """The host saw these tiles fall behind the others: a fired Straggler there is detected (it needs no
        recovery: slow, not dead)."""
        now = time.time()
        for e in self.log.pending():
            if isinstance(e.fault, Straggler) and fault_tiles(e.fault, self.wafer.mesh)[0] in tiles:
                self.log.mark_detected([e], "pace (heartbeats)", now)
                self.log.mark_recovered([e], "none needed: slow, not dead (the decode went on)", now)

    def kernel_faults(self, tiles: list[TileId], epoch: int) -> FaultMap:
        """Kernel command `epoch` is about to run on `tiles`: the faults due fire there (a Trigger's step
        counts kernel commands), the log records them; the fault map every tile of the command gets."""
        reports = self.wafer.call([(t, Tile.kernel_faults, (epoch,)) for t in tiles])
        for r in reports:
            for rec in r["fired"]:
                self.on_message(rec)
        return FaultMap.join(reports)

    def kernel_error(self, error: Exception) -> None:
        """A kernel run ended with `error` (a FaultError): bring the log up to date and mark the faults it
        found as detected by it (a kernel is not recovered by the runtime: its author handles the error)."""
        self.refresh()
        kind = {CoreFailed: FaultKind.CORE, LinkFailed: FaultKind.LINK,
                PayloadCorrupt: FaultKind.CORRUPT}.get(type(error))
        found = [e for e in self.log.pending() if e.kind is kind and _names(error, e.fault)]
        self.log.mark_detected(found, f"kernel: {type(error).__name__}", time.time())

    def tile_died(self, error: Exception, epoch: int) -> None:
        """A tile's process ended during kernel command `epoch` (`error`, a TileDied, names it): a TileCrash
        armed on it fired then (its own report may have died with it) and the host found it."""
        now = time.time()
        crashes = [e for e in self.log.events if isinstance(e.fault, TileCrash) and e.fault.tile == error.tile]
        for e in crashes:
            if e.fired_at is None:
                self.log.mark_fired(e.index, epoch, now)
        self.log.mark_detected([e for e in crashes if e.detected_at is None], f"host: {type(error).__name__}", now)

    def refresh(self) -> list[dict]:
        """Ask every tile that answers what died and fired on it; the log is brought up to date."""
        reports = self.wafer.on_every_tile(Tile.dead)
        for r in reports:
            for rec in r["fired"]:
                self.on_message(rec)
        return reports


def _check_node(fault: NodeLoss, nodes: list[str], node_loss) -> None:
    if node_loss is None:
        raise ValueError("a NodeLoss needs a way to remove a Ray node: wafer.faults(plan, node_loss=...) with "
                         "e.g. a ray.cluster_utils.Cluster's remove_node (tests/cluster shows how)")
    if not 0 <= fault.node < len(nodes):
        raise ValueError(f"{fault.where()}: the wafer's Ray nodes are 0..{len(nodes) - 1} (0: this driver's, "
                         "unless a placement lists them in another order)")


def _names(error: Exception, fault) -> bool:
    """Does a kernel's fault error name `fault` (the dead core, both cores of the dead link; any Corrupt)?"""
    if isinstance(error, CoreFailed):
        return fault.core == error.core
    if isinstance(error, LinkFailed):
        return {fault.a, fault.b} == {error.a, error.b}
    return True
