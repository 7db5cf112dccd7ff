"""Links and a ledger that record into a trace: what a tile sent, how long it waited, which primitives ran.

Contract: :class:`TracedLinks` wraps any waferrt.fabric.links.Links of a tile (its ``tile``, a TileId) and
records into a :class:`~waferrt.core.trace.Recorder` whose track is named ``str(tile)``: every ``send`` as a
span ``send <dir>`` (cat "send"; its tag and bytes), every ``recv`` as ``wait <dir>`` (cat "wait": from the
call until the message is there), and for ``recv_any`` -- which an event-driven tile calls over and over
while idle -- one ``wait <dir>`` span from when the tile last finished recorded work (or first asked, if
later) until a message arrived: the time it waited on its neighbour. A send span also names the message it
sent -- ``to`` (the neighbour tile's track) and ``seq`` (its sequence number on the link, the fabric's
``sent``) -- and a wait span the message it took -- ``from`` and ``seq`` (the fabric's ``taken``) -- so
the trace pairs the two ends of every message (waferrt.core.trace: the flow arrows). Everything else is
the wrapped links' own. :class:`TracedLedger` is a
Ledger whose every primitive (``ledger.op``) is also a span (cat "primitive"; nested primitives nest).
Tracing only wraps: a tile that does not trace uses the plain links and ledger (:func:`kernel_parts`
gives a kernel run what it needs either way).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import numpy as np

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Dir, TileId
from waferrt.core.trace import Recorder


def _nbytes(arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))


class TracedLinks:
    def __init__(self, links, rec: Recorder):
        self.inner, self.rec = links, rec
        self._asked_ns: int | None = None  # when recv_any was first called since the last arrival

    def send(self, d: Dir, tag: str, arrays: list[np.ndarray]) -> None:
        nbytes = _nbytes(arrays)  # before the send: the arrays are handed over
        start, message = time.time_ns(), {}
        try:
            self.inner.send(d, tag, arrays)
            message = {"to": self._peer(d), "seq": self.inner.sent[d]}  # a send that failed names none
        finally:
            self.rec.add(f"send {d.name}", "send", start, time.time_ns(), link=d.name, tag=tag, bytes=nbytes,
                         **message)

    def recv(self, d: Dir, tag: str) -> list[np.ndarray]:
        start = time.time_ns()
        got = self.inner.recv(d, tag)
        self._took(d, tag, got, start)
        return got

    def recv_any(self, timeout: float):
        if self._asked_ns is None:
            self._asked_ns = time.time_ns()
        got = self.inner.recv_any(timeout)
        if got is not None:
            d, tag, arrays = got
            start, self._asked_ns = self.rec.idle_since(self._asked_ns), None
            self._took(d, tag, arrays, start)
        return got

    def _took(self, d: Dir, tag: str, arrays, start: int) -> None:
        """The wait that ended now with a message from link d (its sender's track and sequence number)."""
        self.rec.add(f"wait {d.name}", "wait", start, time.time_ns(), link=d.name, tag=tag, bytes=_nbytes(arrays),
                     **{"from": self._peer(d), "seq": self.inner.taken[d]})

    def _peer(self, d: Dir) -> str:
        """The track of the neighbour tile over link d."""
        t = self.inner.tile
        return str(TileId(t.tx + d.value[0], t.ty + d.value[1]))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class TracedLedger(Ledger):
    def __init__(self, spec, rec: Recorder):
        super().__init__(spec)
        self.rec = rec

    @contextmanager
    def op(self, name: str):
        with self.rec.span(name, "primitive"), super().op(name):
            yield


def kernel_parts(spec, links, rec: Recorder | None, kernel, epoch: int):
    """(ledger, links, span context) for one kernel run: traced ones and a ``kernel <name>`` span (cat
    "kernel") when `rec` is a recorder, the plain ones and no span when it is None."""
    if rec is None:
        return Ledger(spec), links, nullcontext()
    name = getattr(kernel, "__name__", type(kernel).__name__)
    return TracedLedger(spec, rec), TracedLinks(links, rec), rec.span(f"kernel {name}", "kernel", epoch=epoch)
