"""The fabric between tile actors: pyzmq sockets to the four neighbour tiles, nothing pickled.

Contract: a :class:`ZmqLinks` belongs to one tile and implements waferrt.fabric.links.Links.
``bind(ipc_dir, tcp)`` opens the tile's single PULL socket on an ipc:// path (neighbours on the same Ray
node) and, only when some neighbour is on another node, on tcp:// at the node's own address, and returns
both addresses; ``connect({dir: address})`` opens one PUSH socket per neighbour tile. ``send(dir, tag,
arrays)`` writes one message: a msgpack header (link, sequence number, tag, dtype and shape of every array)
followed by each array's raw buffer, sent without copying. ``recv(dir, tag)`` returns the next message
from that neighbour (messages from other neighbours that arrive first are kept in order for later); it
checks the per-link sequence number and the tag, and raises
:class:`~waferrt.fabric.links.FabricTimeout` naming the link when nothing arrives within the deadline
instead of hanging. ``close()`` closes the sockets and removes the ipc socket file.
"""

from __future__ import annotations

import collections
import os
import time

import msgpack
import numpy as np
import zmq

from waferrt.core.mesh import Dir, TileId
from waferrt.fabric.links import FabricProtocolError, FabricTimeout

ZERO_COPY_BYTES = 65536  # pyzmq: below this, copying a buffer into the message beats tracking it


class ZmqLinks:
    def __init__(self, tile: TileId, timeout: float = 30.0):
        self.tile, self.timeout = tile, timeout
        self.ctx = zmq.Context.instance()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.push: dict[Dir, zmq.Socket] = {}
        self.sent = collections.Counter()
        self.received = collections.Counter()
        self.pending: dict[Dir, collections.deque] = {d: collections.deque() for d in Dir}
        self.arrived = 0  # messages taken off the socket (numbers the pending ones in arrival order)
        self.ipc_path: str | None = None
        self.epoch = 0  # the command being run; messages of earlier commands are stale

    def bind(self, ipc_dir: str, tcp: bool = False) -> dict:
        """Bind the receive socket on ipc:// (neighbours on this node) and, only when a neighbour tile is on
        another node (`tcp`), on tcp:// at this node's routable address (never 0.0.0.0)."""
        os.makedirs(ipc_dir, exist_ok=True)
        self.ipc_path = os.path.join(ipc_dir, f"t{self.tile.tx}_{self.tile.ty}")
        self.pull.bind(f"ipc://{self.ipc_path}")
        out = {"ipc": f"ipc://{self.ipc_path}", "tcp": None}
        if tcp:
            from ray.util import get_node_ip_address  # the node's routable IP (the hostname may be 127.0.0.1)

            host = get_node_ip_address()
            out["tcp"] = f"tcp://{host}:{self.pull.bind_to_random_port(f'tcp://{host}')}"
        return out

    def connect(self, peers: dict[Dir, str]) -> None:
        for d, address in peers.items():
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 0)
            s.connect(address)
            self.push[d] = s

    def send(self, d: Dir, tag: str, arrays: list[np.ndarray]) -> None:
        sock = self.push.get(d)
        if sock is None:
            raise FabricProtocolError(f"{self.tile} has no link to a neighbour tile to the {d.name}")
        arrays = [np.asarray(a, order="C") for a in arrays]  # (ascontiguousarray would make 0-d arrays 1-d)
        self.sent[d] += 1
        header = msgpack.packb({"from": d.opposite.name, "seq": self.sent[d], "tag": tag, "epoch": self.epoch,
                                "arrays": [(a.dtype.str, a.shape) for a in arrays]})
        nbytes = sum(a.nbytes for a in arrays)
        sock.send_multipart([header, *arrays], copy=nbytes < ZERO_COPY_BYTES)  # copying small ones is cheaper

    def recv(self, d: Dir, tag: str) -> list[np.ndarray]:
        deadline = time.monotonic() + self.timeout
        while not self._waiting(d):
            if not self._pull_until(deadline):
                raise FabricTimeout(
                    f"{self.tile} waited {self.timeout:.0f}s for message {tag!r} on its {d.name} link and got "
                    "nothing: the neighbour tile is dead, stuck, or ran a different program")
        _, got_tag, arrays, _ = self.pending[d].popleft()
        if got_tag != tag:
            raise FabricProtocolError(f"{self.tile} expected message {tag!r} on its {d.name} link, got "
                                      f"{got_tag!r}: the tiles ran different programs")
        return arrays

    def recv_any(self, timeout: float) -> tuple[Dir, str, list[np.ndarray]] | None:
        """The message that arrived first from any neighbour, as (link, tag, arrays); None when nothing
        arrives within `timeout` seconds (waiting for traffic is no error here)."""
        deadline = time.monotonic() + timeout
        while not (links := [d for d in Dir if self._waiting(d)]):
            if not self._pull_until(deadline):
                return None
        d = min(links, key=lambda d: self.pending[d][0][3])
        _, tag, arrays, _ = self.pending[d].popleft()
        return d, tag, arrays

    def _waiting(self, d: Dir) -> bool:
        """Is a message of the current command waiting from link d? (Drops those of earlier commands.)"""
        queue = self.pending[d]
        while queue and queue[0][0] < self.epoch:  # left over from an earlier command that failed
            queue.popleft()
        return bool(queue)

    def _pull_until(self, deadline: float) -> bool:
        """Take one message off the socket, waiting until `deadline`; False when none came."""
        if self._pull_one(zmq.NOBLOCK):  # something is already there: no poll
            return True
        left = deadline - time.monotonic()
        return left > 0 and bool(self.pull.poll(int(left * 1000) + 1)) and self._pull_one(zmq.NOBLOCK)

    def _pull_one(self, flags: int = 0) -> bool:
        """Take one message off the socket into its link's queue; False when none was waiting (NOBLOCK)."""
        try:
            frames = self.pull.recv_multipart(flags, copy=False)
        except zmq.Again:
            return False
        head = msgpack.unpackb(frames[0].buffer)
        src = Dir[head["from"]]
        self.received[src] += 1
        if head["seq"] != self.received[src]:
            raise FabricProtocolError(f"{self.tile}: message {head['seq']} on the {src.name} link arrived when "
                                      f"{self.received[src]} was due: a message was lost or duplicated")
        arrays = [np.frombuffer(f.buffer, dtype=np.dtype(dt)).reshape(shape)
                  for f, (dt, shape) in zip(frames[1:], head["arrays"], strict=True)]
        self.arrived += 1
        self.pending[src].append((head["epoch"], head["tag"], arrays, self.arrived))
        return True

    def close(self) -> None:
        for s in self.push.values():
            s.close(0)
        self.push.clear()
        self.pull.close(0)
        if self.ipc_path and os.path.exists(self.ipc_path):
            os.unlink(self.ipc_path)
