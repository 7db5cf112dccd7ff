"""The Links protocol: what a tile's links to its neighbour tiles offer, and the errors they raise.

Contract: a :class:`Links` belongs to one tile. ``send(d, tag, arrays)`` delivers a list of numpy arrays
to the neighbour tile in direction ``d`` (N/E/S/W), dtypes and shapes kept (0-d and empty arrays too);
the arrays are handed over (the real fabric sends large ones without copying): do not write to them
after. ``recv(d, tag)`` returns the next message from that neighbour, in the order that neighbour sent
them, and checks that its tag is ``tag`` (the tiles run the same SPMD program, so the tags agree).
``recv_any(timeout)`` returns the message that arrived first from any neighbour as (link, tag, arrays),
or None when nothing arrives within `timeout` (for event-driven programs, which wait for traffic).
Every message is numbered on its link: ``sent[d]`` is the sequence number of the latest message this tile
sent over link d (1, 2, ... per link; 0 before the first; restarting when a link is rewired to a restarted
neighbour), ``taken[d]`` that of the latest message recv/recv_any returned from link d. The receiver's
``taken`` of a message equals the sender's ``sent`` of it: with the two tiles and the link, that names one
message (the trace pairs a send with the receive that took it by it: waferrt.fabric.traced).
Failures are :class:`FabricError` s that name the tile and the link: :class:`FabricTimeout` (nothing
arrived within the deadline) and :class:`FabricProtocolError` (a mismatched tag, a lost or duplicated
message, a send over a link that does not exist). Two fabrics implement it: the in-process one
(waferrt.fabric.loop, threads and queues) and the real one between Ray actors (waferrt.actors.fabric,
pyzmq); tests/unit/test_fabric_conformance.py holds both to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from waferrt.core.mesh import Dir


class FabricError(RuntimeError):
    """A link failed: the message names the tile and the link."""


class FabricTimeout(FabricError, TimeoutError):
    """Nothing arrived on a link within the deadline. ``tile`` waited for its neighbour on ``side`` (a Dir;
    both None where not known)."""

    def __init__(self, message: str, tile=None, side: Dir | None = None):
        super().__init__(message)
        self.tile, self.side = tile, side

    def __reduce__(self):
        return type(self), (str(self), self.tile, self.side)


class FabricProtocolError(FabricError):
    """Tiles disagree: a mismatched tag, a lost or duplicated message, or a link that does not exist."""


class TagMismatch(FabricProtocolError):
    """The message that came on a link is not the one the tile waited for: ``expected`` and ``got`` are their
    tags, ``arrays`` what came (a neighbour's end of kernel carries the primitives it ran)."""

    def __init__(self, tile, side: Dir, expected: str, got: str, arrays: list | None = None):
        super().__init__(f"{tile} expected message {expected!r} on its {side.name} link, got {got!r}: the tiles "
                         "did not run the same primitives")
        self.tile, self.side, self.expected, self.got, self.arrays = tile, side, expected, got, arrays or []

    def __reduce__(self):
        return type(self), (self.tile, self.side, self.expected, self.got, self.arrays)


class Links(Protocol):
    """A tile's links to its neighbour tiles (the fabric)."""

    sent: Mapping[Dir, int]  # the sequence number of the latest message sent over each link
    taken: Mapping[Dir, int]  # the sequence number of the latest message taken from each link

    def send(self, d: Dir, tag: str, arrays: list[np.ndarray]) -> None: ...

    def recv(self, d: Dir, tag: str) -> list[np.ndarray]: ...

    def recv_any(self, timeout: float) -> tuple[Dir, str, list[np.ndarray]] | None: ...
