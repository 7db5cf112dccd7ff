"""Tracing a tile's decode: which spans a TileProgram records, and turning it on and off.

Contract: :func:`trace_program` gives a :class:`~waferrt.decode.program.TileProgram` a
:class:`~waferrt.core.trace.Recorder` (its links wrapped in waferrt.fabric.traced.TracedLinks);
:func:`untrace_program` takes it away again (and returns it: ``.take()`` gives what was recorded).
While it is on, the program records, on its tile's track:

- per stage run a span (cat "compute") named ``embed``, ``layer <i>`` or ``head``, with the micro-batch
  ``mb``, the ``stage``, its ``tokens`` and ``requests``, and the ``cycles`` it booked (the modelled cost
  of the micro-batch as it ran);
- per visit of a micro-batch that runs stages here a span ``mb<n>`` (cat "microbatch") around those
  stage runs and the send to the next tile;
- every send (``send <dir>``) and every wait for a neighbour (``wait <dir>``), from the links, each naming
  its message (the neighbour tile and the link's sequence number): in the written trace an arrow joins the
  send of each hand-over to the wait on the next tile that took it (waferrt.core.trace).

Micro-batches only passing through a tile show as their wait and their send on (an arrow in, an arrow
out). Faults and recoveries are instants on the same recorder (``program.trace.instant(name, "fault", **args)``).
"""

from __future__ import annotations

import time

from waferrt.core.trace import Recorder
from waferrt.fabric.traced import TracedLinks

from .schedule import StageRun
from .stage import Stage


def trace_program(program, rec: Recorder) -> None:
    """Record the program's spans into `rec` from now on."""
    if program.trace is not None:
        untrace_program(program)
    program.trace = rec
    program.links = TracedLinks(program.links, rec)


def untrace_program(program) -> Recorder | None:
    """Stop recording; the recorder it recorded into (None if it was not tracing)."""
    rec = program.trace
    if rec is not None:
        program.trace = None
        program.links = program.links.inner
    return rec


def stage_span(rec: Recorder, stage: Stage, run: StageRun, t0: int) -> None:
    """A run of `stage` that began at t0 (time.time_ns()) and has just ended (named ``stage.name``)."""
    rec.add(stage.name, "compute", t0, time.time_ns(), mb=run.mb, stage=run.stage,
            tokens=len(run.items), requests=len({it.request for it in run.items}), cycles=round(run.cycles))


def microbatch_span(rec: Recorder, mb: int, segment: list[int], tokens: int, t0: int) -> None:
    """Micro-batch mb's visit (its stages in `segment`, then the send on) that began at t0."""
    rec.add(f"mb{mb}", "microbatch", t0, time.time_ns(), mb=mb, stages=f"{segment[0]}-{segment[-1]}",
            tokens=tokens)
