"""The decode loop every tile runs on its own: handle what arrives, and at the head, sample and feed back.

Contract: ``run_tile(program, engine, control, emit, stop)`` runs until ``stop`` is set. A tile takes the
micro-batches that arrive over its links in order (waferrt.decode.program.TileProgram.arrive: pass them
on, or run its stages and send them on). The tile of the embedding and the head also runs the
:class:`~waferrt.serving.engine.HeadEngine`: it takes the host's commands from ``control`` (a
``queue.Queue`` of ``("submit", Submission)`` / ``("cancel", index)``), lets the micro-batches that can
enter in, samples what comes back, and hands the :class:`TokenEvent` s to ``emit`` -- the host only
watches. No host round trip per token, no lock step: each lane's next micro-batch enters as soon as its
previous one left the head.

Micro-batches in flight with nothing arriving for too long end the loop with
:class:`~waferrt.fabric.links.FabricTimeout` (a tile downstream is dead or stuck). How long is derived from
the pace seen so far (:class:`Pace`: ``SLACK`` times the usual gap between arrivals, at least ``FLOOR_S``;
``deadline`` times the machine's :func:`crowding` until the first arrival: a host loaded by other work slows
every tile alike, and nothing measured tells the head so yet), not a fixed number; times the engine's ``load``
(a whole prompt in flight -- a prefill -- is that many ordinary micro-batches' work). Any error ends the loop
and propagates to the caller, which reports it with the tile's name. An idle tile still lets its faults'
timers fire.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

from waferrt.decode.program import TileProgram
from waferrt.fabric.links import FabricTimeout

from .engine import HeadEngine, TokenEvent

POLL_S = 0.005  # how often an idle tile looks at its control queue and its stop flag (a submit waits for it)
FLOOR_S = 10.0  # the shortest wait for a micro-batch in flight before the head calls its pipeline stuck
SLACK = 50.0  # ... else this many times the usual gap between arrivals


class Pace:
    """The head's deadline for a silent pipeline, from the gaps between arrivals seen so far (an EMA)."""

    def __init__(self, first: float):
        self.first, self.gap = first, None

    def arrived(self, gap: float) -> None:
        self.gap = gap if self.gap is None else 0.9 * self.gap + 0.1 * gap

    def limit(self, load: float, crowded: float) -> float:
        """Seconds micro-batches carrying `load` ordinary micro-batches' work may be in flight with nothing
        arriving, on a machine `crowded` times slower than alone (counts until the first arrival only: the
        gaps seen are measured on the crowded machine already)."""
        return load * (self.first * crowded if self.gap is None else max(FLOOR_S, SLACK * self.gap))


def crowding() -> float:
    """How many times slower than alone a busy process runs here lately: the processes that wanted a core over
    the last minute per core (the load average), at least 1; 1 where the system does not say."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except (AttributeError, OSError):  # no load average on this system
        return 1.0


def run_tile(program: TileProgram, engine: HeadEngine | None, control: queue.Queue,
             emit: Callable[[list[TokenEvent]], None], stop: threading.Event, deadline: float = 60.0) -> None:
    waited_since, pace = time.monotonic(), Pace(deadline)
    crowded = crowding()  # once a loop (the load average moves over a minute), not at every idle poll
    while not stop.is_set():
        if engine is not None:
            _take_commands(engine, control, emit)
            for mb, meta in engine.form():
                logits = program.enter(mb, meta)
                if logits is not None:  # the whole chain is on this tile
                    emit(engine.returned(mb, logits))
        got = program.links.recv_any(POLL_S)
        if got is None:
            program.tick(None)
            limit = pace.limit(engine.load(), crowded) if engine is not None and engine.busy else 0.0
            if limit and time.monotonic() - waited_since > limit:
                raise FabricTimeout(
                    f"{program.tile}: micro-batch(es) {sorted(engine.busy.values())} have been in flight for "
                    f"{limit:.0f}s and nothing came back: a tile on the way is dead or stuck")
            continue
        now = time.monotonic()
        pace.arrived(now - waited_since)
        waited_since = now
        back = program.arrive(got[1], got[2])
        if back is not None:
            emit(engine.returned(*back))


def _take_commands(engine: HeadEngine, control: queue.Queue, emit) -> None:
    while True:
        try:
            verb, arg = control.get_nowait()
        except queue.Empty:
            return
        events = engine.submit(arg) if verb == "submit" else engine.cancel(arg)
        if events:
            emit(events)
