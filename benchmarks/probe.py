"""A tile that can measure its own neighbour link: for benchmarks/fabric.py only, never started by a Wafer.

Contract: :class:`ProbeTile` is a :class:`~waferrt.actors.tile.Tile` with four extra methods that move raw
buffers over the tile's real fabric (its ``ZmqLinks``), timed inside the tile process so that the Ray call
that starts them is not counted. Run the two halves of a pair at the same time on two neighbouring tiles:

- ``ping(d, nbytes, n)`` sends n buffers of nbytes over link d, waiting for each echo; returns seconds.
- ``pong(d, n)`` echoes n buffers back over link d.
- ``stream(d, nbytes, n)`` sends n buffers of nbytes back to back, then waits for one acknowledgement;
  returns seconds from the first send to the acknowledgement.
- ``drain(d, n)`` receives n buffers over link d, then acknowledges.
"""

from __future__ import annotations

import time

import numpy as np

from waferrt.actors.tile import Tile
from waferrt.core.mesh import Dir


class ProbeTile(Tile):
    def ping(self, d: str, nbytes: int, n: int) -> float:
        link = Dir[d]
        buf = np.ones(nbytes, np.uint8)
        t0 = time.perf_counter()
        for i in range(n):
            self.links.send(link, f"p{i}", [buf])
            self.links.recv(link, f"p{i}")
        return time.perf_counter() - t0

    def pong(self, d: str, n: int) -> None:
        link = Dir[d]
        for i in range(n):
            arrays = self.links.recv(link, f"p{i}")
            self.links.send(link, f"p{i}", arrays)

    def stream(self, d: str, nbytes: int, n: int) -> float:
        link = Dir[d]
        buf = np.ones(nbytes, np.uint8)
        t0 = time.perf_counter()
        for i in range(n):
            self.links.send(link, f"s{i}", [buf])
        self.links.recv(link, "ack")
        return time.perf_counter() - t0

    def drain(self, d: str, n: int) -> int:
        link, total = Dir[d], 0
        for i in range(n):
            (a,) = self.links.recv(link, f"s{i}")
            total += a.nbytes
        self.links.send(link, "ack", [np.zeros(1, np.uint8)])
        return total
