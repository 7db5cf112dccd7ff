"""Who may talk to a tile: its own CURVE key pair, a ZAP handler that admits only its neighbour tiles' public
keys, and a count of every connection that was refused.

Contract: :func:`keypair` makes a tile's CURVE key pair (``zmq.curve_keypair``) when its fabric is made, so
every wafer session has fresh keys and a secret key never leaves its tile; the public keys are exchanged
through Ray when the tiles start (``actors.remote.start_tiles``). A tile's receive socket is a CURVE
server with its secret key; its send sockets are CURVE clients with the same pair that know each
neighbour's public key.

:class:`Gatekeeper` runs one thread per tile (in the tile's own zmq context) that answers the context's ZAP
requests -- admitting a client only if its public key is one given to ``admit`` (a neighbour's), with that
neighbour's side ("N", "E", "S", "W") and key as the ZAP user id ("S:<key>"), which every message from that
peer then carries as its ``User-Id`` (so a neighbour that was replaced -- a restarted tile whose old process
still runs -- is told from its successor) -- and reads the receive socket's monitor events. ``stats()``
counts connections accepted, authenticated, refused (accepted but not authenticated: a peer without a
neighbour's key pair, speaking something else than ZMTP/CURVE, or still in a handshake, which is closed
after ``HANDSHAKE_SECONDS``), handshake failures by kind, ZAP denials and disconnections (``on_disconnect``
is told of each: a neighbour may have died). Nothing a refused peer sends reaches the socket's queue.
``close()`` stops the thread and closes its sockets."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from waferrt.core.mesh import Dir

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler (RFC 27)
THREAD = "waferrt-gatekeeper"  # the gatekeeper thread's name (a retiring tile checks it has ended)
HANDSHAKE_SECONDS = 10  # a connection that has not authenticated by then is closed

EVENTS = {zmq.EVENT_ACCEPTED: "accepted", zmq.EVENT_HANDSHAKE_SUCCEEDED: "authenticated",
          zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake_failed_auth",
          zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake_failed_protocol",
          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake_failed_no_detail",
          zmq.EVENT_DISCONNECTED: "disconnected"}
_stop_ids = itertools.count()


@dataclass(frozen=True)
class ZapRequest:
    """The frames of a ZAP request (RFC 27) that the answer reads: its id, the security mechanism, and the
    client's credentials (for CURVE, its public key)."""

    request_id: bytes
    mechanism: bytes
    credentials: tuple[bytes, ...]

    @classmethod
    def of(cls, frames: list[bytes]) -> ZapRequest:
        """From the frames as libzmq sends them: version, request id, domain, address, identity, mechanism,
        then the mechanism's credentials."""
        return cls(frames[1], frames[5], tuple(frames[6:]))


def keypair() -> tuple[bytes, bytes]:
    """A fresh CURVE key pair (public, secret), z85-encoded."""
    if not zmq.has("curve"):
        raise RuntimeError("this pyzmq was built without CURVE (libsodium), so the fabric cannot authenticate "
                           "its links: install pyzmq's wheel from PyPI (pip install --force-reinstall pyzmq)")
    return zmq.curve_keypair()


class Gatekeeper:
    """A tile's ZAP handler and receive-socket monitor, on one thread of the tile's zmq context. Make it
    before `sock` (the tile's receive socket) binds, so that no handshake goes unchecked."""

    def __init__(self, ctx: zmq.Context, sock: zmq.Socket):
        self.sides: dict[bytes, bytes] = {}  # z85 public key -> side: nobody until admit
        self.counts = dict.fromkeys([*EVENTS.values(), "zap_denied"], 0)  # only the thread changes them
        self.on_disconnect = None  # called (on this thread) when a peer's connection drops: maybe it died
        zap = ctx.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(ZAP_ENDPOINT)
        stop = f"inproc://waferrt-gatekeeper-{next(_stop_ids)}"
        stop_rx, self._stop = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        stop_rx.bind(stop)
        self._stop.connect(stop)
        monitor = sock.get_monitor_socket(sum(EVENTS))
        self._thread = threading.Thread(target=self._serve, args=(zap, monitor, stop_rx), daemon=True,
                                        name=THREAD)
        self._thread.start()

    def admit(self, neighbours: dict[Dir, bytes]) -> None:
        """From now on, admit these public keys (z85), each as its side."""
        self.sides = {key: d.name.encode() + b":" + key for d, key in neighbours.items()}  # (one assignment)

    def _serve(self, zap: zmq.Socket, monitor: zmq.Socket, stop: zmq.Socket) -> None:
        poller = zmq.Poller()
        for s in (zap, monitor, stop):
            poller.register(s, zmq.POLLIN)
        try:
            while stop not in (ready := dict(poller.poll())):
                if zap in ready:
                    zap.send_multipart(self._answer(ZapRequest.of(zap.recv_multipart())))
                if monitor in ready:
                    event = parse_monitor_message(monitor.recv_multipart())["event"]
                    if event in EVENTS:  # (not MONITOR_STOPPED)
                        self.counts[EVENTS[event]] += 1
                    if event == zmq.EVENT_DISCONNECTED and self.on_disconnect is not None:
                        self.on_disconnect()
        finally:
            for s in (zap, monitor, stop):
                s.close(0)

    def _answer(self, request: ZapRequest) -> list[bytes]:
        """The ZAP reply (RFC 27) to libzmq's request: 200 with the neighbour's side and key as user id, or
        400."""
        side = None
        if request.mechanism == b"CURVE" and len(request.credentials) == 1:
            side = self.sides.get(z85.encode(request.credentials[0]))
        if side is None:
            self.counts["zap_denied"] += 1
            return [b"1.0", request.request_id, b"400", b"not a key of this wafer session", b"", b""]
        return [b"1.0", request.request_id, b"200", b"OK", side, b""]

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
