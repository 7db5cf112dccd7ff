"""What every trace must be: Chrome / Perfetto trace-event JSON whose spans nest on each track and whose flow
arrows each join one span to another.

Contract: ``check_trace(doc)`` asserts the format's required fields (every event has ph, ts, pid, tid and
name; an "X" has a dur >= 0; "M" events name every process and thread that has events; a flow event has an
id and a cat) and that the complete events of one track nest -- two spans on a track either do not overlap
or one holds the other (times compared in nanoseconds, as written) -- and checks the flows (below); it
returns {(process name, track name): [its "X" and "i" events, by start]}. ``check_flows(doc)`` asserts that
every flow start ("s") has exactly one finish ("f") with the same id, cat and name (so ids are unique in the
document), that no finish comes before its start, and that each binds to a span that holds its time: the
start to the span open on its track, the finish ("bp": "e") to the span open on its own track, or (no "bp")
to the next span that begins there. "Open" is as ui.perfetto.dev reads the file: events by time, ties in the
order written, a span open from its push until the next push on its track after its end -- so a flow event
written right after a span that holds its time binds to that span. It returns one :class:`Arrow` per flow,
with the spans it binds to. (tests/ is on sys.path: ``from tracecheck import check_trace``.)
"""

from __future__ import annotations

from dataclasses import dataclass

FLOW = ("s", "t", "f")


def _ns(us) -> int:
    return round(us * 1000)


@dataclass(frozen=True)
class Arrow:
    id: object
    name: str
    cat: str
    start: dict  # the "s" event
    finish: dict  # the "f" event
    out: dict  # the span the arrow leaves: on the start's track
    into: dict  # the span it enters: on the finish's track
    out_track: tuple[str, str]  # (process name, track name)
    into_track: tuple[str, str]


def check_trace(doc: dict) -> dict[tuple[str, str], list[dict]]:
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    procs, threads, tracks = _names(events), _threads(events), {}
    for e in events:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in e, f"event without {key!r}: {e}"
        assert e["ph"] in ("X", "M", "i", *FLOW), e
        if e["ph"] == "M":
            continue
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    out = {}
    for (pid, tid), evs in tracks.items():
        assert pid in procs and (pid, tid) in threads, f"events on an unnamed track {(pid, tid)}"
        open_ends: list[int] = []  # the ends of the spans that hold the current one
        for e in _spans(evs):
            start, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], \
                f"{threads[(pid, tid)]}: span {e['name']} [{start}, {end}] ns overlaps its outer span ({open_ends[-1]})"
            open_ends.append(end)
        out[(procs[pid], threads[(pid, tid)])] = sorted((e for e in evs if e["ph"] not in FLOW), key=lambda e: e["ts"])
    for (pid, _), name in threads.items():
        out.setdefault((procs[pid], name), [])
    check_flows(doc)
    return out


def check_flows(doc: dict) -> list[Arrow]:
    events = doc["traceEvents"]
    procs, threads = _names(events), _threads(events)
    bound = _bind(events)
    flows: dict[object, dict[str, list[dict]]] = {}
    for e in events:
        if e["ph"] in FLOW:
            assert "id" in e and "cat" in e, f"a flow event without an id or a cat: {e}"
            flows.setdefault(e["id"], {}).setdefault(e["ph"], []).append(e)
    arrows = []
    for fid, ends in flows.items():
        starts, finishes = ends.get("s", []), ends.get("f", [])
        assert len(starts) == 1 and len(finishes) == 1, \
            f"flow id {fid!r}: {len(starts)} starts and {len(finishes)} finishes (one of each, ids unique): {ends}"
        (s,), (f,) = starts, finishes
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]), f"flow id {fid!r}: its ends differ in cat or name"
        assert _ns(s["ts"]) <= _ns(f["ts"]), f"flow id {fid!r} finishes ({f['ts']}) before it starts ({s['ts']})"
        out, into = bound.get(id(s)), bound.get(id(f))
        assert out is not None, f"flow id {fid!r} starts at {s['ts']} outside every span of its track"
        assert into is not None, f"flow id {fid!r} finishes at {f['ts']} where no span of its track takes it"
        arrows.append(Arrow(fid, s["name"], s["cat"], s, f, out, into, (procs[s["pid"]], threads[(s["pid"], s["tid"])]),
                            (procs[f["pid"]], threads[(f["pid"], f["tid"])])))
    return arrows


def _names(events) -> dict:
    return {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}


def _threads(events) -> dict:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


def _spans(evs: list[dict]) -> list[dict]:
    """A track's spans, outer before inner."""
    return sorted((e for e in evs if e["ph"] == "X"), key=lambda e: (_ns(e["ts"]), -_ns(e["dur"])))


def _bind(events: list[dict]) -> dict[int, dict]:
    """{id(flow event): the span it binds to}, read as Perfetto's importer does: every track's spans and flow
    events by time, ties in the order written; a span is pushed on its track's stack, popping the spans that
    ended before it began (or just as it began, unless both last no time); a start or an enclosing finish
    binds to the top of the stack if that span holds its time; any other finish to the next span pushed."""
    stacks: dict[tuple, list[dict]] = {}
    waiting: dict[tuple, list[dict]] = {}  # finishes without "bp": "e", for the next span of their track
    out: dict[int, dict] = {}
    order = sorted((e for e in events if e["ph"] in ("X", *FLOW)), key=lambda e: _ns(e["ts"]))  # stable
    for e in order:
        track, t = (e["pid"], e["tid"]), _ns(e["ts"])
        stack = stacks.setdefault(track, [])
        if e["ph"] == "X":
            dur = _ns(e["dur"])
            while stack and (_end(stack[-1]) < t or (_end(stack[-1]) == t and not _ns(stack[-1]["dur"]) == 0 == dur)):
                stack.pop()
            stack.append(e)
            for f in waiting.pop(track, []):
                out[id(f)] = e
        elif e["ph"] == "f" and e.get("bp") != "e":
            waiting.setdefault(track, []).append(e)
        elif stack and _ns(stack[-1]["ts"]) <= t <= _end(stack[-1]):
            out[id(e)] = stack[-1]
    return out


def _end(e: dict) -> int:
    return _ns(e["ts"]) + _ns(e["dur"])


OPPOSITE = {"N": "S", "S": "N", "E": "W", "W": "E"}


def check_messages(doc: dict) -> list[Arrow]:
    """The fabric's arrows (waferrt.fabric.traced): each leaves a ``send <dir>`` span and enters a ``wait <dir'>``
    span of the neighbour it names (dir' opposite dir), both naming the same message (tag, seq, the two tiles),
    and every send and every wait of the wall-clock process has exactly one arrow (in a run that ended
    normally every message sent was taken). Returns the arrows."""
    tracks = check_trace(doc)
    arrows = [a for a in check_flows(doc) if a.cat == "message"]
    for a in arrows:
        o, i = a.out["args"], a.into["args"]
        assert (a.out["cat"], a.into["cat"]) == ("send", "wait"), f"arrow {a.name}: {a.out} -> {a.into}"
        assert (o["to"], i["from"]) == (a.into_track[1], a.out_track[1]), f"arrow {a.name} joins other tiles: {a}"
        assert o["seq"] == i["seq"] and o["tag"] == i["tag"] == a.name and OPPOSITE[o["link"]] == i["link"], a
    ends = [id(a.out) for a in arrows] + [id(a.into) for a in arrows]
    joined = set(ends)
    assert len(joined) == len(ends), "a span with two arrows"
    for (_, track), evs in tracks.items():
        for e in evs:
            if e["ph"] == "X" and e["cat"] in ("send", "wait"):
                assert id(e) in joined, f"{track}: {e} has no arrow"
    return arrows


def check_handovers(doc: dict) -> list[Arrow]:
    """A decode's trace: every hand-over of a micro-batch from one stage's tile to the next stage's tile (the
    compute spans say which tile ran stage s of micro-batch n) is a chain of arrows named ``mb<n>><s>``, one
    per hop, from the tile of stage s-1 to the tile of stage s. Returns the arrows."""
    arrows = check_messages(doc)
    ran = {(e["args"]["mb"], e["args"]["stage"]): track for track, evs in check_trace(doc).items()
           for e in evs if e["ph"] == "X" and e["cat"] == "compute"}
    hops = {}
    for a in arrows:
        hops.setdefault((a.name, a.out_track), []).append(a)
    for (mb, s), track in ran.items():
        before = ran.get((mb, s - 1))
        if s == 0 or before is None or before == track:
            continue
        at, path = before, []
        while at != track:
            step = hops.get((f"mb{mb}>{s}", at), [])
            assert len(step) == 1, f"micro-batch {mb}, stage {s}: {len(step)} arrows leave {at[1]} (one hop each)"
            path.append(step[0])
            at = step[0].into_track
            assert len(path) <= len(ran), f"micro-batch {mb}, stage {s}: the arrows go round in circles"
    return arrows
