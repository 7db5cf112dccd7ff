"""The fabric between tile actors: pyzmq sockets to the four neighbour tiles, authenticated, nothing pickled.

Contract: a :class:`ZmqLinks` belongs to one tile and implements waferrt.fabric.links.Links. It makes the
tile's CURVE key pair and runs its gatekeeper (``actors.guard``) in its own zmq context, so every link -- ipc
and tcp -- is encrypted and only the neighbour tiles of this wafer session get past the handshake; nothing
from anyone else reaches the receive queue. Wiring takes three steps, each done on every tile before the next
(``actors.remote.start_tiles``): ``bind(ipc_dir, tcp)`` opens the tile's single PULL socket on an ipc:// path
in `ipc_dir` (made 0700; neighbours on the same Ray node) and, only when some neighbour is on another node, on
tcp:// at the node's own address, and returns both addresses and the tile's public key; ``admit({dir: public
key})`` tells it its neighbours' keys (a handshake refused because it came first would not be retried);
``connect({dir: address})`` opens one PUSH socket per neighbour tile, which checks that the peer holds that
neighbour's secret key. ``send(dir, tag, arrays)`` writes one message: a msgpack header (link, sequence
number, tag, epoch, a CRC-32 of the payload, dtype and shape of every array) followed by each array's raw
buffer, sent without copying (``sent[dir]``: the message's sequence number). ``recv(dir, tag)`` returns the
next message from that neighbour (messages from other neighbours that arrive first are kept in order for
later), ``recv_any`` the one that arrived first from any of them (None after a timeout: waiting for traffic;
``taken[dir]``: the sequence number of the message taken last); recv checks the per-link sequence number and
the tag, drops messages of earlier epochs, and raises :class:`~waferrt.fabric.links.FabricTimeout` naming the link when
nothing arrives within the deadline instead of hanging. A lost or duplicated message is a
:class:`~waferrt.fabric.links.FabricProtocolError`, a payload that fails its checksum (a Corrupt fault's bit
flips) a :class:`~waferrt.faults.errors.PayloadCorrupt`, each raised by the recv of the link it belongs to
(once; the link then follows the sender's numbering again).

Nothing a peer sends is fatal to the tile or kept without bound (:class:`FabricLimits`): a message whose
sender is not the neighbour it names, or that is not msgpack, has a bad header, the wrong number of frames,
a dtype/shape that does not match its bytes, is oversized, or would overflow its link's pending queue is
dropped and counted by reason. ``rewire(dir, key, address)`` replaces a neighbour that was restarted (its
new key, its new socket, sequence numbers from the start; what still comes from the one it replaced --
queued, or sent by an old process that lives on -- is dropped as ``replaced_peer``). ``stats()`` returns
those counts with the gatekeeper's (refused connections, handshake failures). ``close()`` closes the sockets
and removes the ipc socket file."""

from __future__ import annotations

import collections
import math
import os
import time
from dataclasses import dataclass

import msgpack
import numpy as np
import zmq

from waferrt.core.mesh import Dir, TileId
from waferrt.fabric.links import FabricProtocolError, FabricTimeout, TagMismatch
from waferrt.faults.errors import PayloadCorrupt
from waferrt.faults.wire import checksum, flip

from .guard import HANDSHAKE_SECONDS, Gatekeeper, keypair

ZERO_COPY_BYTES = 65536  # pyzmq: below this, copying a buffer into the message beats tracking it
HEADER_KEYS = {"from", "seq", "tag", "epoch", "sum", "arrays"}
ARRAY_KINDS = "biufc"  # bool, ints, floats, complex: what the fabric carries (never objects or records)


@dataclass(frozen=True)
class FabricLimits:
    """The most a tile's receive side holds, whatever its peers send."""

    message_bytes: int = 256 << 20  # the arrays of one message (also zmq.MAXMSGSIZE, per frame)
    header_bytes: int = 64 << 10
    queued: int = 1000  # zmq.RCVHWM: messages zmq holds per peer (beyond it, the sender keeps them)
    pending: int = 1024  # messages recv keeps per link for later
    pending_bytes: int = 1 << 30  # their arrays' bytes, per link


class Dropped(Exception):
    """A message the tile does not keep: dropped and counted under `reason`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ZmqLinks:
    def __init__(self, tile: TileId, timeout: float = 30.0, limits: FabricLimits | None = None):
        self.tile, self.timeout = tile, timeout
        self.limits = limits = limits or FabricLimits()
        self.public, self.secret = keypair()
        self.neighbours: dict[Dir, bytes] = {}  # their public keys, by side: the links this tile has
        self.ctx = zmq.Context()  # its own: a context has one ZAP handler, this tile's gatekeeper
        self.pull = self.ctx.socket(zmq.PULL)
        for opt, value in ((zmq.LINGER, 0), (zmq.RCVHWM, limits.queued), (zmq.MAXMSGSIZE, limits.message_bytes),
                           (zmq.HANDSHAKE_IVL, HANDSHAKE_SECONDS * 1000), (zmq.CURVE_SERVER, 1)):
            self.pull.setsockopt(opt, value)
        self.pull.curve_secretkey = self.secret
        self.gate = Gatekeeper(self.ctx, self.pull)
        self.push: dict[Dir, zmq.Socket] = {}
        self.peers: dict[Dir, str] = {}  # the neighbour tiles' addresses this tile sends to (ipc or tcp)
        self.sent = collections.Counter()
        self.received = collections.Counter()
        self.taken = collections.Counter()  # per link: the sequence number of the message recv last returned
        self.pending: dict[Dir, collections.deque] = {d: collections.deque() for d in Dir}
        self.arrived = 0  # messages taken off the socket (numbers the pending ones in arrival order)
        self.pending_bytes = collections.Counter()
        self.dropped = collections.Counter()
        self.endpoints: dict[str, str | None] = {}
        self.ipc_path: str | None = None
        self.epoch = 0  # the command being run; messages of earlier commands are stale
        self.corrupt = None  # fault injection: FaultState.on_send, the bits to flip on a link (on the wire)

    def bind(self, ipc_dir: str, tcp: bool = False) -> dict:
        """Bind the receive socket on ipc:// (neighbours on this node) and, only when a neighbour tile is on
        another node (`tcp`), on tcp:// at this node's routable address (never 0.0.0.0). Returns the addresses
        and this tile's public key."""
        os.makedirs(ipc_dir, mode=0o700, exist_ok=True)
        self.ipc_path = os.path.join(ipc_dir, f"t{self.tile.tx}_{self.tile.ty}")
        self.pull.bind(f"ipc://{self.ipc_path}")
        self.endpoints = {"ipc": f"ipc://{self.ipc_path}", "tcp": None}
        if tcp:
            from ray.util import get_node_ip_address  # the node's routable IP (the hostname may be 127.0.0.1)

            host = get_node_ip_address()
            self.endpoints["tcp"] = f"tcp://{host}:{self.pull.bind_to_random_port(f'tcp://{host}')}"
        return {**self.endpoints, "key": self.public}

    def admit(self, neighbours: dict[Dir, bytes]) -> None:
        """The neighbour tiles' public keys, by side: only they get in, and only they are sent to."""
        self.neighbours = dict(neighbours)
        self.gate.admit(self.neighbours)

    def connect(self, peers: dict[Dir, str]) -> None:
        for d, address in peers.items():
            if d not in self.neighbours:
                raise FabricProtocolError(f"{self.tile} has no key for its {d.name} neighbour: admit its key "
                                          "before connecting to it")
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 0)
            s.curve_publickey, s.curve_secretkey = self.public, self.secret
            s.curve_serverkey = self.neighbours[d]  # the peer must prove it holds that neighbour's key
            s.connect(address)
            self.push[d] = s
            self.peers[d] = address

    def rewire(self, d: Dir, key: bytes, address: str) -> None:
        """The neighbour to the `d` side was replaced (a restarted tile): only its new key gets in, sends go to
        its new socket, and the link's sequence numbers start again."""
        old = self.push.pop(d, None)
        if old is not None:
            old.close(0)
        self.admit({**self.neighbours, d: key})
        self.sent[d] = self.received[d] = self.taken[d] = 0
        while self.pending[d]:
            self._pop(d)
        self.connect({d: address})

    def send(self, d: Dir, tag: str, arrays: list[np.ndarray]) -> None:
        sock = self.push.get(d)
        if sock is None:
            raise FabricProtocolError(f"{self.tile} has no link to a neighbour tile to the {d.name}")
        arrays = [np.asarray(a, order="C") for a in arrays]  # (ascontiguousarray would make 0-d arrays 1-d)
        self.sent[d] += 1
        header = msgpack.packb({"from": d.opposite.name, "seq": self.sent[d], "tag": tag, "epoch": self.epoch,
                                "sum": checksum(arrays), "arrays": [(a.dtype.str, a.shape) for a in arrays]})
        if self.corrupt is not None and any(a.nbytes for a in arrays) and (flips := self.corrupt(d)):
            arrays = flip(arrays, *flips)
        nbytes = sum(a.nbytes for a in arrays)
        sock.send_multipart([header, *arrays], copy=nbytes < ZERO_COPY_BYTES)  # copying small ones is cheaper

    def recv(self, d: Dir, tag: str) -> list[np.ndarray]:
        deadline = time.monotonic() + self.timeout
        while not self._waiting(d):
            if not self._pull_until(deadline):
                raise FabricTimeout(
                    f"{self.tile} waited {self.timeout:.0f}s for message {tag!r} on its {d.name} link and got "
                    f"nothing: the neighbour tile is dead, stuck, or ran a different program{self._drops()}",
                    self.tile, d)
        _, got_tag, payload, _, self.taken[d] = self._pop(d)
        if isinstance(payload, Exception):
            raise payload
        if got_tag != tag:
            raise TagMismatch(self.tile, d, tag, got_tag, payload)
        return payload

    def recv_any(self, timeout: float) -> tuple[Dir, str, list[np.ndarray]] | None:
        """The message that arrived first from any neighbour, as (link, tag, arrays); None when nothing
        arrives within `timeout` seconds (waiting for traffic is no error here)."""
        deadline = time.monotonic() + timeout
        while not (links := [d for d in Dir if self._waiting(d)]):
            if not self._pull_until(deadline):
                return None
        d = min(links, key=lambda d: self.pending[d][0][3])
        _, tag, payload, _, self.taken[d] = self._pop(d)
        if isinstance(payload, Exception):
            raise payload
        return d, tag, payload

    def _waiting(self, d: Dir) -> bool:
        """Is a message of the current command waiting from link d? (Drops those of earlier commands.)"""
        self._drop_stale(d)
        return bool(self.pending[d])

    def _pull_until(self, deadline: float) -> bool:
        """Take one message off the socket, waiting until `deadline`; False when none came. (A poll may say
        readable before the whole of a message is there: then wait on.)"""
        while True:
            if self._pull_one(zmq.NOBLOCK):  # something is already there: no poll
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.pull.poll(int(left * 1000) + 1)

    def _pull_one(self, flags: int = 0) -> bool:
        """Take one message off the socket into its link's queue, or drop and count it; False when none was
        waiting (NOBLOCK)."""
        try:
            frames = self.pull.recv_multipart(flags, copy=False)
        except zmq.Again:
            return False
        try:
            side, seq, epoch, tag, arrays, crc = self._check(frames)
        except Dropped as e:
            self.dropped[e.reason] += 1
            return True
        due = self.received[side] + 1
        if seq != due:
            self.received[side] = max(self.received[side], seq)  # raise once, then follow the sender again
            arrays = FabricProtocolError(f"{self.tile}: message {seq} on the {side.name} link arrived when {due} "
                                         f"was due: a message was lost or duplicated{self._drops()}")
        else:
            self.received[side] = seq
            if checksum(arrays) != crc:  # flipped on the way: never used, raised by the recv of its link
                self.dropped["corrupt"] += 1
                sender = TileId(self.tile.tx + side.value[0], self.tile.ty + side.value[1])
                arrays = PayloadCorrupt(self.tile, sender, side.name, f"message {seq} ({tag!r})")
        if epoch < self.epoch:  # left over from an earlier command that failed
            self.dropped["stale_epoch"] += 1
            return True
        self.arrived += 1
        self.pending[side].append((epoch, tag, arrays, self.arrived, seq))
        self.pending_bytes[side] += _nbytes(arrays)
        return True

    def _check(self, frames: list[zmq.Frame]) -> tuple[Dir, int, int, str, list[np.ndarray], int]:
        """(link, seq, epoch, tag, arrays, checksum) of a message from a neighbour, or Dropped with the reason."""
        try:
            name, _, key = frames[0].get("User-Id").partition(":")  # the side and key the gatekeeper admitted
            side = Dir[name]
        except (zmq.ZMQError, KeyError):
            raise Dropped("unknown_peer") from None
        if key.encode() != self.neighbours.get(side):  # admitted before that neighbour was replaced (restarted)
            raise Dropped("replaced_peer")
        nbytes = sum(map(len, frames[1:]))
        if len(frames[0]) > self.limits.header_bytes or nbytes > self.limits.message_bytes:
            raise Dropped("oversized")
        head = _header(frames[0].buffer)
        if head["from"] not in {d.name for d in self.neighbours}:
            raise Dropped("no_link")
        if head["from"] != side.name:
            raise Dropped("wrong_link")
        if len(frames) != 1 + len(head["arrays"]):
            raise Dropped("frame_count")
        self._drop_stale(side)
        limits = self.limits
        if len(self.pending[side]) >= limits.pending or self.pending_bytes[side] + nbytes > limits.pending_bytes:
            raise Dropped("backlog")
        arrays = [_array(f, dt, shape) for f, (dt, shape) in zip(frames[1:], head["arrays"], strict=True)]
        return side, head["seq"], head["epoch"], head["tag"], arrays, head["sum"]

    def _pop(self, d: Dir) -> tuple:
        entry = self.pending[d].popleft()
        self.pending_bytes[d] -= _nbytes(entry[2])
        return entry

    def _drop_stale(self, d: Dir) -> None:
        while self.pending[d] and self.pending[d][0][0] < self.epoch:  # from an earlier command that failed
            self._pop(d)
            self.dropped["stale_epoch"] += 1

    def _drops(self) -> str:
        bad = {k: n for k, n in self.dropped.items() if k != "stale_epoch"}
        return f" ({self.tile} dropped messages: {bad})" if bad else ""

    def stats(self) -> dict:
        """Who tried to talk to this tile and what was dropped: connections (accepted, authenticated,
        refused), handshake failures by kind, ZAP denials, dropped messages by reason, messages received and
        pending per link, where the tile listens and where it sends (each neighbour's address, by side)."""
        return {"tile": str(self.tile), "endpoints": dict(self.endpoints), "public_key": self.public.decode(),
                "peers": {d.name: a for d, a in self.peers.items()},
                **self.gate.stats(), "dropped": dict(self.dropped),
                "received": {d.name: n for d, n in self.received.items()},
                "pending": {d.name: len(q) for d, q in self.pending.items() if q}}

    def close(self) -> None:
        stopped = self.gate.close()
        for s in self.push.values():
            s.close(0)
        self.push.clear()
        self.pull.close(0)
        if stopped:
            self.ctx.term()
        if self.ipc_path and os.path.exists(self.ipc_path):
            os.unlink(self.ipc_path)


def _header(buf) -> dict:
    """The msgpack header of a message, its fields checked (not their meaning); Dropped otherwise."""
    try:
        head = msgpack.unpackb(buf)
    except Exception:  # noqa: BLE001 - any bytes may come: whatever msgpack makes of them, it is not a header
        raise Dropped("not_msgpack") from None
    ok = (isinstance(head, dict) and head.keys() == HEADER_KEYS and isinstance(head["from"], str)
          and isinstance(head["tag"], str) and isinstance(head["arrays"], list)
          and all(type(head[k]) is int and head[k] >= 0 for k in ("seq", "epoch", "sum"))
          and all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], list)
                  and all(type(n) is int and n >= 0 for n in a[1]) for a in head["arrays"]))
    if not ok:
        raise Dropped("bad_header")
    return head


def _array(frame: zmq.Frame, dtype: str, shape: list[int]) -> np.ndarray:
    """A frame's bytes as the array its header describes; Dropped if they do not match."""
    try:
        dt = np.dtype(dtype)
    except Exception:  # noqa: BLE001 - numpy parses many strings, and fails on the rest in many ways
        raise Dropped("bad_array") from None
    if dt.kind not in ARRAY_KINDS or dt.fields is not None or math.prod(shape) * dt.itemsize != len(frame):
        raise Dropped("bad_array")
    return np.frombuffer(frame.buffer, dtype=dt).reshape(shape)


def _nbytes(payload) -> int:
    return sum(a.nbytes for a in payload) if isinstance(payload, list) else 0
