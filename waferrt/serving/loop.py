"""The decode loop every tile runs on its own: handle what arrives, and at the head, sample and feed back.

Contract: ``run_tile(program, engine, control, emit, stop)`` runs until ``stop`` is set. A tile takes the
micro-batches that arrive over its links in order (waferrt.decode.program.TileProgram.arrive: pass them
on, or run its stages and send them on). The tile of the embedding and the head also runs the
:class:`~waferrt.serving.engine.HeadEngine`: it takes the host's commands from ``control`` (a
``queue.Queue`` of ``("submit", Submission)`` / ``("cancel", index)``), lets the micro-batches that can
enter in, samples what comes back, and hands the :class:`TokenEvent` s to ``emit`` -- the host only
watches. No host round trip per token, no lock step: each lane's next micro-batch enters as soon as its
previous one left the head.

A micro-batch that has been in flight for ``deadline`` seconds with nothing arriving ends the loop with
:class:`~waferrt.fabric.links.FabricTimeout` (a tile downstream is dead or stuck); any error ends the loop
and propagates to the caller, which reports it with the tile's name.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from waferrt.decode.program import TileProgram
from waferrt.fabric.links import FabricTimeout

from .engine import HeadEngine, TokenEvent

POLL_S = 0.02  # how often an idle tile looks at its control queue and its stop flag


def run_tile(program: TileProgram, engine: HeadEngine | None, control: queue.Queue,
             emit: Callable[[list[TokenEvent]], None], stop: threading.Event, deadline: float = 60.0) -> None:
    waited_since = time.monotonic()
    while not stop.is_set():
        if engine is not None:
            _take_commands(engine, control, emit)
            for mb, meta in engine.form():
                logits = program.enter(mb, meta)
                if logits is not None:  # the whole chain is on this tile
                    emit(engine.returned(mb, logits))
        got = program.links.recv_any(POLL_S)
        if got is None:
            if engine is not None and engine.busy and time.monotonic() - waited_since > deadline:
                raise FabricTimeout(
                    f"{program.tile}: micro-batch(es) {sorted(engine.busy.values())} have been in flight for "
                    f"{deadline:.0f}s and nothing came back: a tile on the way is dead or stuck")
            continue
        waited_since = time.monotonic()
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
