"""Links and a ledger that record into a trace: what a tile sent, how long it waited, which primitives ran.

Contract: :class:`TracedLinks` wraps any waferrt.fabric.links.Links and records into a
:class:`~waferrt.core.trace.Recorder`: every ``send`` as a span ``send <dir>`` (cat "send"; its tag and
bytes), every ``recv`` as ``wait <dir>`` (cat "wait": from the call until the message is there), and for
``recv_any`` -- which an event-driven tile calls over and over while idle -- one ``wait <dir>`` span from
when the tile last finished recorded work (or first asked, if later) until a message arrived: the time
it waited on its neighbour. Everything else is the wrapped links' own. :class:`TracedLedger` is a
Ledger whose every primitive (``ledger.op``) is also a span (cat "primitive"; nested primitives nest).
Tracing only wraps: a tile that does not trace uses the plain links and ledger (:func:`kernel_parts`
gives a kernel run what it needs either way).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import numpy as np

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Dir
from waferrt.core.trace import Recorder


def _nbytes(arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))


class TracedLinks:
    def __init__(self, links, rec: Recorder):
        self.inner, self.rec = links, rec
        self._asked_ns: int | None = None  # when recv_any was first called since the last arrival

    def send(self, d: Dir, tag: str, arrays: list[np.ndarray]) -> None:
        nbytes = _nbytes(arrays)  # before the send: the arrays are handed over
        with self.rec.span(f"send {d.name}", "send", link=d.name, tag=tag, bytes=nbytes):
            self.inner.send(d, tag, arrays)

    def recv(self, d: Dir, tag: str) -> list[np.ndarray]:
        start = time.time_ns()
        got = self.inner.recv(d, tag)
        self.rec.add(f"wait {d.name}", "wait", start, time.time_ns(), link=d.name, tag=tag, bytes=_nbytes(got))
        return got

    def recv_any(self, timeout: float):
        if self._asked_ns is None:
            self._asked_ns = time.time_ns()
        got = self.inner.recv_any(timeout)
        if got is not None:
            d, tag, arrays = got
            start, self._asked_ns = self.rec.idle_since(self._asked_ns), None
            self.rec.add(f"wait {d.name}", "wait", start, time.time_ns(), link=d.name, tag=tag,
                         bytes=_nbytes(arrays))
        return got

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
