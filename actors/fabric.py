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
        while True:
            queue = self.pending[d]
            while queue and queue[0][0] < self.epoch:  # left over from an earlier command that failed
                queue.popleft()
            if queue:
                break
            if self._pull_one(zmq.NOBLOCK):  # something is already there: no poll
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not self.pull.poll(int(left * 1000) + 1):
                raise FabricTimeout(
                    f"{self.tile} waited {self.timeout:.0f}s for message {tag!r} on its {d.name} link and got "
                    "nothing: the neighbour tile is dead, stuck, or ran a different program")
            self._pull_one()
        _, got_tag, arrays = queue.popleft()
        if got_tag != tag:
            raise FabricProtocolError(f"{self.tile} expected message {tag!r} on its {d.name} link, got "
                                      f"{got_tag!r}: the tiles ran different programs")
        return arrays

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
        self.pending[src].append((head["epoch"], head["tag"], arrays))
        return True

    def close(self) -> None:
        for s in self.push.values():
            s.close(0)
        self.push.clear()
        self.pull.close(0)
        if self.ipc_path and os.path.exists(self.ipc_path):
            os.unlink(self.ipc_path)
