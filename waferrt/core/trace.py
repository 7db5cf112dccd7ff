"""What a track did and when: the trace recorder every tile (and the host) fills while tracing is on.

Contract: a :class:`Recorder` belongs to one track -- a tile, or the host -- and is filled by one thread.
``with rec.span(name, cat, **args):`` records a :class:`Span` (wall-clock start and end, integer
nanoseconds from ``time.time_ns()``), ``rec.instant(name, cat, **args)`` an :class:`Instant` (a fault, a
recovery, a token arriving), ``rec.add(name, cat, start_ns, end_ns, **args)`` a span measured elsewhere.
Spans opened inside one another nest (the inner one ends first); spans one after the other do not
overlap: a track is a stack. ``rec.idle_since(t)`` is when the track last did something it recorded
(for spans of waiting that must not cover work). ``rec.take()`` hands back everything recorded (plain,
picklable values) and starts afresh.

Tracing is off unless a recorder is given: the code that records holds ``None`` instead and checks it,
so a run without tracing does no work for it. Spans and arguments are plain values (str, int, float,
bool), so they cross a Ray call or a process boundary as they are.

The clock: ``time.time_ns()``, the machine's wall clock. Tiles on one machine (separate processes) share
it, so their tracks line up to the microsecond. Across machines the tracks are only as aligned as the
machines' clocks (NTP: typically within a millisecond, sometimes worse); a span is always right about its
own length, and the order of events on one track is always right.

:func:`chrome_trace` turns :class:`Process` es (named groups of tracks) into the Chrome / Perfetto
trace-event format (``{"traceEvents": [...]}``: "X" complete events with ``ts``/``dur`` in microseconds,
"i" instants, "M" metadata naming processes and threads); ui.perfetto.dev and chrome://tracing open it.
Wall-clock processes are written in whole microseconds, both ends floored, so spans that nest in
nanoseconds still nest exactly; a modelled timeline (times of nanoseconds) keeps three decimals.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

Args = tuple[tuple[str, object], ...]  # (key, plain value) pairs: hashable, picklable


@dataclass(frozen=True)
class Span:
    name: str
    cat: str  # what kind of work: "compute", "send", "wait", "host", "kernel", "primitive", ...
    start_ns: int  # time.time_ns() when it began
    end_ns: int
    args: Args = ()


@dataclass(frozen=True)
class Instant:
    name: str
    cat: str  # "fault", "recovery", "token", ...
    at_ns: int
    args: Args = ()


class Recorder:
    def __init__(self, track: str):
        self.track = track
        self.events: list[Span | Instant] = []
        self.last_end_ns = 0  # when the latest recorded span ended

    @contextmanager
    def span(self, name: str, cat: str, **args):
        start = time.time_ns()
        try:
            yield
        finally:
            self.add(name, cat, start, time.time_ns(), **args)

    def add(self, name: str, cat: str, start_ns: int, end_ns: int, **args) -> None:
        """A span measured by the caller (start_ns <= end_ns, both from time.time_ns())."""
        if end_ns < start_ns:
            raise ValueError(f"span {name!r} on {self.track} ends ({end_ns}) before it starts ({start_ns})")
        self.events.append(Span(name, cat, start_ns, end_ns, tuple(args.items())))
        self.last_end_ns = max(self.last_end_ns, end_ns)

    def instant(self, name: str, cat: str, **args) -> None:
        self.events.append(Instant(name, cat, time.time_ns(), tuple(args.items())))

    def idle_since(self, t_ns: int) -> int:
        """When the track became idle, if it was idle since `t_ns`: the later of t_ns and the end of the
        last span recorded (a wait that began at t_ns did not cover the work recorded after it)."""
        return max(t_ns, self.last_end_ns)

    def take(self) -> list[Span | Instant]:
        out, self.events, self.last_end_ns = self.events, [], 0
        return out


@dataclass(frozen=True)
class Process:
    """A group of tracks shown together (a Perfetto process): the wafer's tiles and host, or a model."""

    name: str
    tracks: tuple[tuple[str, tuple[Span | Instant, ...]], ...]  # (track name, its events), in display order
    origin_ns: int = 0  # subtracted from every time: 0 on the trace's time axis
    exact: bool = True  # whole microseconds (wall clock); False: to the nanosecond (a modelled timeline)


def wall_process(host: Recorder, tiles: dict[str, list], origin_ns: int) -> Process:
    """The emulator on the wall clock: the host's track first, then one track per tile (in the order given)."""
    tracks = ((host.track, tuple(host.events)), *((t, tuple(evs)) for t, evs in tiles.items()))
    return Process("wafer (emulator wall clock)", tracks, origin_ns)


def chrome_trace(processes: list[Process], meta: dict | None = None) -> dict:
    """The trace-event JSON document of `processes` (pid = position + 1, tid = track position + 1)."""
    out: list[dict] = []
    for pid, proc in enumerate(processes, 1):
        out += [_meta(pid, 0, "process_name", {"name": proc.name}),
                _meta(pid, 0, "process_sort_index", {"sort_index": pid})]
        for tid, (track, events) in enumerate(proc.tracks, 1):
            out += [_meta(pid, tid, "thread_name", {"name": track}),
                    _meta(pid, tid, "thread_sort_index", {"sort_index": tid})]
            out += [_event(e, pid, tid, proc) for e in events]
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def _meta(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": name, "args": args}


def _us(t_ns: int, proc: Process) -> float | int:
    rel = t_ns - proc.origin_ns
    return rel // 1000 if proc.exact else round(rel / 1000, 3)


def _event(e: Span | Instant, pid: int, tid: int, proc: Process) -> dict:
    if isinstance(e, Instant):
        return {"ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": _us(e.at_ns, proc), "name": e.name,
                "cat": e.cat, "args": dict(e.args)}
    ts = _us(e.start_ns, proc)
    dur = _us(e.end_ns, proc) - ts if proc.exact else round((e.end_ns - e.start_ns) / 1000, 3)
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": e.name, "cat": e.cat,
            "args": dict(e.args)}


def write_trace(path: str | Path, processes: list[Process], meta: dict | None = None) -> Path:
    """Write the trace-event JSON of `processes` to `path` (open it in ui.perfetto.dev)."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(processes, meta), separators=(",", ":")))
    return path
