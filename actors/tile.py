"""A tile actor: a tile's cores (waferrt.tiles.TileCores) with their process, sockets and host.

Contract: :class:`Tile` is :class:`~waferrt.tiles.TileCores` -- the SRAM book, the DSM blocks, the kernels,
the decode program, the faults, tracing -- plus what needs pyzmq or a process of its own
(``waferrt.actors.remote`` makes it a Ray actor): its fabric links (``bind``, ``admit``, ``connect``,
``rewire`` for a restarted neighbour: waferrt.actors.fabric.ZmqLinks), its heartbeat to the host's inbox
(waferrt.actors.stream), so a frozen or dead tile is noticed within seconds, and its decode loop in a
thread of its own (``decode_start`` / ``decode_submit`` / ``decode_stop``: no Ray call per token;
``decode_attach`` for a streaming decode). ``retire`` and ``reset`` let a closed tile's process serve another
Wafer (waferrt.actors.pool). A fault that fires is reported to the host at once, a TileCrash
ends the process with ``os._exit``; after a fault the host ends the loop with ``decode_abort``, re-plans
and sets the decode up again. Its methods, its own and those it inherits, are what the runtime calls
(``Wafer.call(tile, Tile.method, args)``) and return plain data.
"""

from __future__ import annotations

import os
import threading
import time

from waferrt.core.mesh import Dir, MeshSpec, TileId
from waferrt.core.spec import HardwareSpec
from waferrt.decode.schedule import StageRun
from waferrt.faults.state import Fired
from waferrt.tiles.cores import TileCores, fired_dict

CRASH_GRACE_S = 0.2  # a crashing tile's last report gets this long to leave before the process dies
RETIRE_S = 5.0  # how long a retiring tile waits for its decode loop's thread to end


class Tile(TileCores):
    def __init__(self, mesh: MeshSpec, spec: HardwareSpec, tile: TileId, timeout: float = 30.0):
        super().__init__(mesh, spec, tile, timeout)
        self.faults.on_fire, self.faults.crash = self._report, self._crash
        self.heartbeat = None  # beats to the host once watched
        self.host: str | None = None
        self._outboxes = threading.local()  # one socket to the host per thread that reports

    # -- fabric -----------------------------------------------------------------------------------------
    def bind(self, ipc_dir: str, tcp: bool = False) -> dict:
        """Open this tile's receive socket (tcp too when a neighbour tile is on another node); its addresses
        and the tile's public key."""
        from .fabric import ZmqLinks

        self.links = ZmqLinks(self.tile, self.timeout)
        return self.links.bind(ipc_dir, tcp)

    def address(self) -> dict:
        """Where this tile listens and its public key (what bind returned)."""
        return {**self.links.endpoints, "key": self.links.public}

    def admit(self, keys: dict[str, bytes]) -> None:
        """The neighbour tiles' public keys, by side: only they may talk to this tile."""
        self.links.admit({Dir[d]: k for d, k in keys.items()})

    def connect(self, peers: dict[str, str], host: str) -> None:
        """Link to the neighbour tiles' sockets and start beating to the host's inbox (`host`)."""
        from .stream import Heartbeat

        self.links.connect({Dir[d]: a for d, a in peers.items()})
        self.links.corrupt = self.faults.on_send
        self.links.gate.on_disconnect = lambda: self._tell("lost")  # a neighbour's link dropped: is it dead?
        self.host = host
        self.heartbeat = Heartbeat(host, str(self.tile), self.pace)

    def rewire(self, d: str, key: bytes, address: str) -> None:
        """The neighbour to the `d` side was restarted: admit its new key, link to its new socket, and number
        that link's messages from the start again."""
        self.links.rewire(Dir[d], key, address)

    def fabric_stats(self) -> dict:
        """Who tried to talk to this tile and what its fabric dropped (``ZmqLinks.stats``)."""
        return self.links.stats() if self.links is not None else {"tile": str(self.tile)}

    # -- reports to the host ----------------------------------------------------------------------------
    def _report(self, rec: Fired) -> None:
        """A fault fired here: tell the host at once."""
        self._tell("fault", **fired_dict(rec))

    def _tell(self, kind: str, **fields) -> None:
        """A message to the host's inbox, from whichever thread this runs in (one socket per thread)."""
        if self.host is None:
            return
        from .stream import Outbox

        out = getattr(self._outboxes, "out", None)
        if out is None:
            out = self._outboxes.out = Outbox(self.host, str(self.tile))
        out.send(kind, **fields)

    def _crash(self) -> None:
        """A TileCrash fired: the process dies as a real crash would (no cleanup, no goodbye)."""
        time.sleep(CRASH_GRACE_S)  # the report of the crash leaves first
        os._exit(1)

    # -- the decode loop --------------------------------------------------------------------------------
    def decode_attach(self, memoryx, head_count: int) -> None:
        """A streaming decode: the blocks come from the MemoryX actor `memoryx` (actors.memoryx.StreamClient)."""
        from .memoryx import StreamClient

        self.decoder.attach(StreamClient(memoryx, self.decoder.setup.config.n_layers, head_count))

    def decode_start(self, epoch: int, lanes: int = 2, deadline: float = 60.0) -> None:
        """Start this tile's decode loop (waferrt.serving.loop) in a thread of its own; returns at once."""
        from .decoding import LoopThread

        self.ensure_idle()
        self.new_epoch(epoch)
        self.loop = LoopThread(self.decoder, self.host, lanes, deadline, epoch)

    def decode_submit(self, subs: list) -> None:
        """Hand requests (waferrt.serving.Submission) to the decode loop of the head's tile."""
        self.loop.submit(subs)

    def decode_cancel(self, index: int) -> None:
        self.loop.cancel(index)

    def decode_runs(self, since: int) -> list[StageRun]:
        """The stage runs the running decode loop booked from the `since`-th on (it goes on running: a server's
        modelled times while it serves)."""
        return list(self.loop.program.records[since:]) if self.loop is not None else []

    def decode_stop(self) -> list[StageRun]:
        """End the decode loop: the stage runs it booked."""
        loop, self.loop = self.loop, None
        return loop.stop() if loop is not None else []

    def decode_abort(self) -> list[StageRun]:
        """End the decode loop after a fault elsewhere (its own error, if any, is already reported): the stage
        runs it booked."""
        loop, self.loop = self.loop, None
        return loop.abort() if loop is not None else []

    # -- the process ------------------------------------------------------------------------------------
    def pid(self) -> int:
        return os.getpid()

    def whereabouts(self) -> tuple[str, int, int]:
        """(this machine's id, the user id, the process id): a host on the same machine as the same user maps
        its weight files itself and watches this process (actors.watch.Watch.local)."""
        from .watch import machine_id

        return machine_id(), os.getuid(), os.getpid()

    def retire(self) -> bool:
        """Close this tile to be kept for another Wafer (actors.pool): its sockets closed, its heartbeat and
        decode loop ended; True when no thread of its own is left running, so that ``reset`` may make it new."""
        from .decoding import THREAD as LOOP_THREAD  # (imported here, as where the threads start: no zmq at import)
        from .guard import THREAD as GATE_THREAD
        from .stream import HEARTBEAT_THREAD

        loop = self.loop
        self.close()
        if loop is not None:
            loop.thread.join(RETIRE_S)
            if not loop.thread.is_alive():  # its own socket to the host (close() only stops the loop)
                loop.out.close()
        own = (LOOP_THREAD, GATE_THREAD, HEARTBEAT_THREAD)
        return not [t for t in threading.enumerate() if t.name in own and t.is_alive()]

    def reset(self, mesh: MeshSpec, spec: HardwareSpec, tile: TileId, timeout: float = 30.0) -> int:
        """Become tile `tile` of `mesh`, as a new actor would start (nothing of what it held before is left: its
        attributes are dropped and made again); its process id."""
        self.__dict__.clear()
        type(self).__init__(self, mesh, spec, tile, timeout)
        return os.getpid()

    def close(self) -> None:
        out = getattr(self._outboxes, "out", None)
        if out is not None:
            out.close()
        if self.loop is not None:
            self.loop.stop_flag.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.links is not None:
            self.links.close()
        self.links = self.heartbeat = None
