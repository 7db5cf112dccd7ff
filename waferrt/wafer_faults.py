"""The fault side of a Wafer: faults armed on its tiles, what is dead, and dead tiles replaced.

Contract: :class:`WaferFaults` is the part of ``waferrt.runtime.Wafer`` (which derives from it) that faults
and recovery use: ``inject(fault)`` and ``with wafer.faults(plan):`` arm faults on the tiles they concern
(waferrt.inject.FaultSession; the local backend refuses the kinds that need Ray); ``dead_tiles()`` the tiles
that do not answer (or sit on a lost node); ``node_list()`` / ``driver_node()`` the Ray nodes a NodeLoss
counts; ``restart(tiles, nodes)`` new tile actors in place of dead ones, wired to their neighbours. Each
first checks the Wafer is open (``live``). It reads the Wafer's state (tiles, nodes, watch, session) and
owns none of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from .core.mesh import TileId
from .localtiles import check_fault


class WaferFaults:
    """Faults on a Wafer's tiles (module docstring); a mixin of ``waferrt.runtime.Wafer``."""

    def inject(self, fault) -> int:
        """Arm a fault (waferrt.faults: CoreFailure, LinkFailure, Corrupt, Straggler, TileCrash) on the tiles
        it concerns; it fires when its trigger holds (at once by default; ``Trigger(step=N)``: at the N-th
        command or decode micro-batch). Returns its number in ``wafer.session.log``."""
        from .inject import FaultSession

        self.live()
        if self.backend == "local":
            check_fault(fault)
        if self.session is None:
            self.session = FaultSession(self)
        return self.session.inject(fault)

    def faults(self, plan, node_loss: Callable[[int], None] | None = None, nodes: list[str] | None = None):
        """``with wafer.faults(plan) as session:`` arms every fault of a FaultPlan on entry and disarms what
        has not fired on exit; ``session.log`` says what fired, was detected and recovered. `node_loss(i)`
        carries out a NodeLoss of node i, the Ray node ``nodes[i]`` (default: :meth:`node_list`), e.g. with
        a ray.cluster_utils.Cluster's remove_node."""
        from .inject import FaultSession

        self.live()
        return FaultSession(self, plan, node_loss, nodes)

    def dead_tiles(self) -> list[TileId]:
        """The tiles that do not answer a ping within seconds (dead, or frozen: as good as dead), and those
        on a lost node."""
        self.live()
        if self.backend == "local":
            return []
        swept = set(self.watch.sweep())
        return [t for t in self.tiles if t in swept or self.nodes.get(t) in self.lost]

    def node_list(self) -> list[str]:
        """The Ray nodes that host this wafer's tiles: this driver's first, then the others in tile order
        (the indices a NodeLoss counts when no placement lists the nodes)."""
        self.live()
        return list(dict.fromkeys([self._here, *(self.nodes[t] for t in sorted(self.nodes))]))

    def driver_node(self) -> str:
        """The Ray node this driver runs on."""
        self.live()
        return self._here

    def restart(self, tiles: list[TileId], nodes: dict[TileId, str] | None = None) -> None:
        """Replace these (dead) tiles by new tile actors, on `nodes` (default: where they were), wired to their
        neighbours; they hold nothing yet. The wafer works again (``failed`` is cleared)."""
        from waferrt.actors.remote import TileLaunch, restart_tiles

        self.live()
        self.nodes.update(nodes or {})
        if tiles:
            launch = TileLaunch(self.mesh, self.spec, self._namespace, self._ipc_dir, dict(self.nodes), self.timeout,
                                self.watch.inbox.addresses)
            self.tiles = restart_tiles(launch, self.tiles, tiles)
            self.watch.track(self.tiles)
            self.watch.reset(tiles)
            self._local = (self._local - set(tiles)) | self.watch.local(tiles)
        self.failed = None
