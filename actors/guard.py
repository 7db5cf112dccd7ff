"""Who may talk to a tile: per-session CURVE keys, a ZAP handler that admits only the neighbour tiles' keys,
and a count of every connection that was refused.

Contract: :func:`session_keys` makes a fresh CURVE key pair for every tile of a mesh (``zmq.curve_keypair``;
a new wafer session, new keys) and returns each tile's :class:`TileKeys`: its own pair and the public keys of
its neighbour tiles, one per side. A tile's receive socket is a CURVE server with its secret key; its send
sockets are CURVE clients with the same pair, that know each neighbour's public key.

:class:`Gatekeeper` runs one thread per tile (in the tile's own zmq context) that answers the context's
ZAP requests -- admitting a client only if its public key is a neighbour's, with the neighbour's side
("N", "E", "S", "W") as the ZAP user id, which every message from that peer then carries as its
``User-Id`` -- and reads the receive socket's monitor events. ``stats()`` counts connections accepted,
authenticated, refused (accepted but not authenticated: a peer without the session's keys, speaking
something else than ZMTP/CURVE, or still in a handshake that times out after ``HANDSHAKE_SECONDS``),
handshake failures by kind, ZAP denials and disconnections. Nothing a refused peer sends reaches the
socket's queue. ``close()`` stops the thread and closes its sockets.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from waferrt.core.mesh import Dir, MeshSpec, TileId

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler (RFC 27)
HANDSHAKE_SECONDS = 10  # a connection that has not authenticated by then is closed

EVENTS = {zmq.EVENT_ACCEPTED: "accepted", zmq.EVENT_HANDSHAKE_SUCCEEDED: "authenticated",
          zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake_failed_auth",
          zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake_failed_protocol",
          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake_failed_no_detail",
          zmq.EVENT_DISCONNECTED: "disconnected"}
_stop_ids = itertools.count()


@dataclass(frozen=True)
class TileKeys:
    """A tile's CURVE key pair (z85) and the public keys of its neighbour tiles, by side."""

    public: bytes
    secret: bytes = field(repr=False)
    neighbours: tuple[tuple[Dir, bytes], ...]

    def neighbour(self, d: Dir) -> bytes:
        return dict(self.neighbours)[d]


def session_keys(mesh: MeshSpec) -> dict[TileId, TileKeys]:
    """Fresh keys for one wafer session: a key pair per tile, each tile told its neighbours' public keys."""
    if not zmq.has("curve"):
        raise RuntimeError("this pyzmq was built without CURVE (libsodium): the fabric cannot authenticate "
                           "its links; install a pyzmq wheel from PyPI (pip install --force-reinstall pyzmq)")
    pairs = {t: zmq.curve_keypair() for t in mesh.tiles()}
    return {t: TileKeys(public, secret, tuple((d, pairs[n][0]) for d in Dir
                                              if (n := mesh.tile_neighbour(t, d)) is not None))
            for t, (public, secret) in pairs.items()}


class Gatekeeper:
    """A tile's ZAP handler and receive-socket monitor, on one thread of the tile's zmq context. Make it
    before `sock` (the tile's receive socket) binds, so that no handshake goes unchecked."""

    def __init__(self, ctx: zmq.Context, keys: TileKeys, sock: zmq.Socket):
        self.sides = {public: d.name.encode() for d, public in keys.neighbours}  # z85 public key -> side
        self.counts = dict.fromkeys([*EVENTS.values(), "zap_denied"], 0)  # only the thread changes them
        zap = ctx.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(ZAP_ENDPOINT)
        stop = f"inproc://waferrt-gatekeeper-{next(_stop_ids)}"
        stop_rx, self._stop = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        stop_rx.bind(stop)
        self._stop.connect(stop)
        monitor = sock.get_monitor_socket(sum(EVENTS))
        self._thread = threading.Thread(target=self._serve, args=(zap, monitor, stop_rx), daemon=True,
                                        name="waferrt-gatekeeper")
        self._thread.start()

    def _serve(self, zap: zmq.Socket, monitor: zmq.Socket, stop: zmq.Socket) -> None:
        poller = zmq.Poller()
        for s in (zap, monitor, stop):
            poller.register(s, zmq.POLLIN)
        try:
            while stop not in (ready := dict(poller.poll())):
                if zap in ready:
                    zap.send_multipart(self._answer(zap.recv_multipart()))
                if monitor in ready:
                    event = parse_monitor_message(monitor.recv_multipart())["event"]
                    if event in EVENTS:  # (not MONITOR_STOPPED)
                        self.counts[EVENTS[event]] += 1
        finally:
            for s in (zap, monitor, stop):
                s.close(0)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply (RFC 27) to libzmq's request: 200 with the neighbour's side as user id, or 400."""
        _version, request_id, _domain, _address, _identity, mechanism, *credentials = request
        side = None
        if mechanism == b"CURVE" and len(credentials) == 1:
            side = self.sides.get(z85.encode(credentials[0]))
        if side is None:
            self.counts["zap_denied"] += 1
            return [b"1.0", request_id, b"400", b"not a key of this wafer session", b"", b""]
        return [b"1.0", request_id, b"200", b"OK", side, b""]

    def stats(self) -> dict[str, int]:
        out = dict(self.counts)
        out["refused"] = out["accepted"] - out["authenticated"]
        return out

    def close(self) -> bool:
        """Stop the thread; False if it did not stop (then the context must not be terminated)."""
        try:
            self._stop.send(b"", zmq.NOBLOCK)
        except zmq.Again:  # the thread is gone already
            pass
        self._thread.join(5)
        self._stop.close(0)
        return not self._thread.is_alive()
