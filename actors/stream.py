"""The tiles' line to the host: tokens, errors and heartbeats, pushed by the tiles, never asked for.

Contract: the host (the driver that opened the Wafer) binds one :class:`HostInbox` (a PULL socket: ipc:// in
the wafer's ipc directory; tcp:// on the driver's address too when tiles run on other nodes); every tile
connects an :class:`Outbox` (a PUSH socket) to it. A message is one msgpack map: ``{"k": "ev", "tile", "e",
"ev": [[index, token, finish, float32 logits bytes or None], ...]}`` (the head's TokenEvents; e: the
decode's epoch), ``{"k": "err", "tile", "type", "msg", "e"}`` (a tile's decode loop failed), ``{"k":
"fault", "tile", "index", "fault", "step", "at"}`` (an injected fault fired on the tile:
waferrt.faults.model.fault_dict) or ``{"k": "lost", "tile"}`` (a neighbour's connection to the tile dropped:
it may have died), ``{"k": "beat", "tile", "n", "pace"}`` (a tile is alive; n counts its beats; pace: its
seconds per stage run lately, or None). ``HostInbox.get(timeout)`` returns what arrived (a list, [] when
nothing came within `timeout`); a frame that is not such a map is dropped and counted. A tile's
:class:`Heartbeat` thread sends a beat every ``BEAT_S`` seconds from its own socket, so a frozen or killed
tile falls silent while a busy one does not."""

from __future__ import annotations

import os
import threading

import msgpack
import zmq

HEARTBEAT_THREAD = "heartbeat"  # the beating thread's name (a retiring tile checks it has ended)
BEAT_S = 0.25  # seconds between a tile's heartbeats


class HostInbox:
    def __init__(self, ipc_dir: str, tcp: bool = False):
        self.sock = zmq.Context.instance().socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.path = os.path.join(ipc_dir, "host")
        self.sock.bind(f"ipc://{self.path}")
        self.addresses = {"ipc": f"ipc://{self.path}", "tcp": None}
        if tcp:
            from ray.util import get_node_ip_address

            host = get_node_ip_address()
            self.addresses["tcp"] = f"tcp://{host}:{self.sock.bind_to_random_port(f'tcp://{host}')}"
        self.dropped = 0

    def get(self, timeout: float) -> list[dict]:
        """Every message that arrived within `timeout` seconds (at least one waited for)."""
        out = []
        if not self.sock.poll(int(timeout * 1000)):
            return out
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                msg = msgpack.unpackb(frame)
            except Exception:  # noqa: BLE001 - not ours: dropped, counted
                msg = None
            if isinstance(msg, dict) and msg.get("k") in ("ev", "err", "beat", "fault", "lost"):
                out.append(msg)
            else:
                self.dropped += 1

    def close(self) -> None:
        self.sock.close(0)
        if os.path.exists(self.path):
            os.unlink(self.path)


class Outbox:
    """A tile's socket to the host inbox (one per thread that sends)."""

    def __init__(self, address: str, tile: str):
        self.tile = tile
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 1000)  # a last error still leaves when the tile closes
        self.sock.connect(address)

    def send(self, kind: str, **fields) -> None:
        self.sock.send(msgpack.packb({"k": kind, "tile": self.tile, **fields}))

    def events(self, events, epoch: int = 0) -> None:
        self.send("ev", e=epoch, ev=[[e.index, e.token, e.finish, None if e.logits is None else e.logits.tobytes()]
                            for e in events])

    def close(self) -> None:
        self.sock.close()


class Heartbeat:
    """A thread that beats every BEAT_S seconds to the host, from its own socket, until stopped; each beat
    carries the tile's pace (``pace()``: seconds per stage run lately, or None)."""

    def __init__(self, address: str, tile: str, pace=lambda: None):
        self._stop, self.pace = threading.Event(), pace
        self._thread = threading.Thread(target=self._beat, args=(address, tile), daemon=True, name=HEARTBEAT_THREAD)
        self._thread.start()

    def _beat(self, address: str, tile: str) -> None:
        out, n = Outbox(address, tile), 0
        try:
            while not self._stop.wait(BEAT_S):
                n += 1
                out.send("beat", n=n, pace=self.pace())
        finally:
            out.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * BEAT_S + 1)
