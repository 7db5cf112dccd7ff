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
"i" instants, "M" metadata naming processes and threads, "s"/"f" flow events); ui.perfetto.dev and
chrome://tracing open it. Wall-clock processes are written in whole microseconds, both ends floored, so
spans that nest in nanoseconds still nest exactly; a modelled timeline (times of nanoseconds) keeps three
decimals. A track's events are written in the order they happened (a span before the spans it holds).

Messages between tracks are flow arrows. A span whose args name ``to`` (a track of the same process) and
``seq`` sent the message numbered ``seq`` on its link to that track; a span on that track whose args name
``from`` (the sender's track), the same ``seq`` and the same ``tag`` took it. :func:`message_flows` pairs
them (:class:`Flow`), and each pair is written as a flow start ("ph": "s") right after the sending span, at
its start, and a flow finish ("ph": "f", "bp": "e": bound to the enclosing span) inside the taking span, at
or after the start and as close to the span's end -- the message's arrival -- as the viewers can tell apart
from the next span: half a microsecond before it. Both carry the cat "message", the message's tag as name
and an id unique in the document (Perfetto pairs by id, cat and name; chrome://tracing by id alone).
"""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class Flow:
    """One message between two tracks: the span that sent it and the span that took it, each as (track name,
    index of the span in that track's events)."""

    name: str  # the message's tag
    out: tuple[str, int]
    into: tuple[str, int]


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
    # (message_flows pairs the spans that sent and took each message between these tracks)
    origin_ns: int = 0  # subtracted from every time: 0 on the trace's time axis
    exact: bool = True  # whole microseconds (wall clock); False: to the nanosecond (a modelled timeline)


def wall_process(host: Recorder, tiles: dict[str, list], origin_ns: int) -> Process:
    """The emulator on the wall clock: the host's track first, then one track per tile (in the order given)."""
    tracks = ((host.track, tuple(host.events)), *((t, tuple(evs)) for t, evs in tiles.items()))
    return Process("wafer (emulator wall clock)", tracks, origin_ns)


def message_flows(tracks) -> list[Flow]:
    """The messages between `tracks` ((name, events) pairs, as in a Process): each span that took a message
    (args ``from``, ``seq``, ``tag``) paired with the span that sent it (on track ``from``; args ``to`` = the
    taker's track, the same ``seq`` and ``tag``). A link numbers its messages afresh when it is rewired (a
    restarted tile), so after a recovery one key can name two messages seconds apart: a taking span pairs with
    the latest sending span of its key that began before it ended, each used once. An end without its other
    end (sent as tracing stopped, or its receiver failed first) has no arrow."""
    sends: dict[tuple, list[tuple[int, str, int]]] = {}
    takes = []
    for track, events in tracks:
        for i, e in enumerate(events):
            a = dict(e.args) if isinstance(e, Span) else {}
            if "seq" in a and "to" in a:
                sends.setdefault((track, a["to"], a["seq"], a.get("tag")), []).append((e.start_ns, track, i))
            elif "seq" in a and "from" in a:
                takes.append((e.end_ns, track, i, (a["from"], track, a["seq"], a.get("tag"))))
    flows = []
    for end, track, i, key in sorted(takes):
        ends = sends.get(key, [])
        began = [k for k, (start, _, _) in enumerate(ends) if start <= end]
        if began:
            _, out_track, j = ends.pop(max(began, key=lambda k: ends[k][0]))
            flows.append(Flow(str(key[3]), (out_track, j), (track, i)))
    return flows


def chrome_trace(processes: list[Process], meta: dict | None = None) -> dict:
    """The trace-event JSON document of `processes` (pid = position + 1, tid = track position + 1), with an
    arrow per message between tracks of a process (message_flows)."""
    out: list[dict] = []
    late: list[dict] = []  # flow finishes at the very time of their start: written after every start
    ids = itertools.count(1)
    for pid, proc in enumerate(processes, 1):
        out += [_meta(pid, 0, "process_name", {"name": proc.name}),
                _meta(pid, 0, "process_sort_index", {"sort_index": pid})]
        after: dict[tuple[str, int], list[dict]] = {}  # span -> the flow events written right after it
        tids = {track: tid for tid, (track, _) in enumerate(proc.tracks, 1)}
        tracks = dict(proc.tracks)
        for flow in message_flows(proc.tracks):
            ends = _flow_events(flow, proc, tracks, {"pid": pid, "id": next(ids)})
            if ends is not None:
                start, finish = ends
                start["tid"], finish["tid"] = tids[flow.out[0]], tids[flow.into[0]]
                after.setdefault(flow.out, []).append(start)
                (late if finish["ts"] == start["ts"] else after.setdefault(flow.into, [])).append(finish)
        for tid, (track, events) in enumerate(proc.tracks, 1):
            out += [_meta(pid, tid, "thread_name", {"name": track}),
                    _meta(pid, tid, "thread_sort_index", {"sort_index": tid})]
            for i in sorted(range(len(events)), key=lambda i: _order(events[i], i)):
                out.append(_event(events[i], pid, tid, proc))
                out += after.get((track, i), ())
    return {"traceEvents": out + late, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def _order(e: Span | Instant, i: int) -> tuple[int, int, int]:
    """A track's events as they happened: by start, a span before the spans it holds, ties as recorded."""
    return (e.at_ns, 0, i) if isinstance(e, Instant) else (e.start_ns, -e.end_ns, i)


def _flow_events(flow: Flow, proc: Process, tracks: dict, common: dict) -> tuple[dict, dict] | None:
    """The flow start (at the sending span's start) and finish (inside the taking span, not before the start,
    half a unit before the span's end when there is room: apart from the next span); None when the taking
    span ended before the sending one began as written (tracks on machines whose clocks disagree)."""
    sent, took = tracks[flow.out[0]][flow.out[1]], tracks[flow.into[0]][flow.into[1]]
    ts, end = _us(sent.start_ns, proc), _us(took.end_ns, proc)
    if end < ts:
        return None
    earliest = max(ts, _us(took.start_ns, proc))
    at = (end - 0.5 if proc.exact else round(end - 0.0005, 4)) if end > earliest else end
    common = {**common, "name": flow.name, "cat": "message"}
    return {"ph": "s", "ts": ts, **common}, {"ph": "f", "bp": "e", "ts": at, **common}


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
    from .files import atomic_open

    path = Path(path)
    with atomic_open(path) as f:
        f.write(json.dumps(chrome_trace(processes, meta), separators=(",", ":")))
    return path
