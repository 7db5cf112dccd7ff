"""A tile actor's decode loop, in a thread of its own, so the tile decodes while its Ray methods stay free.

Contract: :class:`LoopThread` starts waferrt.serving.loop.run_tile for one tile's TileProgram (with the
HeadEngine when the tile hosts the embedding and the head) in a daemon thread; the events it emits and the
error that ends it go to the host over an :class:`~waferrt.actors.stream.Outbox` at once (the host does
not wait for ``stop`` to learn of a failure). ``submit`` / ``cancel`` hand commands to the loop (a
queue; the loop takes them between micro-batches). ``stop()`` ends the loop and returns the stage runs it
booked -- or raises the loop's error; ``abort()`` returns them in any case (a fault is being recovered).
"""

from __future__ import annotations

import queue
import threading

from waferrt.decode.program import TileProgram
from waferrt.serving.engine import HeadEngine, Submission
from waferrt.serving.loop import crowding, run_tile

from .stream import Outbox

THREAD = "decode"  # the loop thread's name (a retiring tile checks it has ended: actors.tile)
STOP_S = 30.0  # how long stop() waits for the loop to finish what it is doing (times the machine's crowding)


class LoopThread:
    def __init__(self, program: TileProgram, host: str, lanes: int, deadline: float, epoch: int = 0):
        self.program, self.epoch = program, epoch
        setup = program.setup
        self.engine = HeadEngine.of(setup, lanes) if program.hosts(0) else None
        self.control: queue.Queue = queue.Queue()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.out = Outbox(host, str(program.tile))
        program.records.clear()
        self.thread = threading.Thread(target=self._run, args=(deadline,), daemon=True, name=THREAD)
        self.thread.start()

    def _run(self, deadline: float) -> None:
        try:
            run_tile(self.program, self.engine, self.control, self._emit, self.stop_flag, deadline)
        except BaseException as e:  # noqa: BLE001 - reported to the host now, raised again by stop()
            self.error = e
            self.out.send("err", type=type(e).__name__, msg=str(e), e=self.epoch)

    def _emit(self, events) -> None:
        self.out.events(events, self.epoch)

    def submit(self, subs: list[Submission]) -> None:
        for sub in subs:
            self.control.put(("submit", sub))

    def cancel(self, index: int) -> None:
        self.control.put(("cancel", index))

    def stop(self) -> list:
        runs = self.abort()
        if self.error is not None:
            raise self.error
        return runs

    def abort(self) -> list:
        """End the loop whatever its state (its error, if any, was reported when it happened): its runs."""
        self.stop_flag.set()
        wait = STOP_S * crowding()  # a stage run in progress is slower on a loaded host
        self.thread.join(wait)
        self.out.close()
        if self.thread.is_alive():
            raise TimeoutError(f"{self.program.tile}: the decode loop did not stop within {wait:.0f}s")
        return list(self.program.records)
