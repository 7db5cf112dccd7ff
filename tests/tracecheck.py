"""What every trace must be: Chrome / Perfetto trace-event JSON whose spans nest on each track.

Contract: ``check_trace(doc)`` asserts the format's required fields (every event has ph, ts, pid, tid and
name; an "X" has a dur >= 0; "M" events name every process and thread that has events) and that the
complete events of one track nest -- two spans on a track either do not overlap or one holds the other
(times compared in nanoseconds, as written) -- and returns {(process name, track name): [its "X" and "i"
events, by start]}. (tests/ is on sys.path: ``from tracecheck import check_trace``.)
"""

from __future__ import annotations


def _ns(us) -> int:
    return round(us * 1000)


def check_trace(doc: dict) -> dict[tuple[str, str], list[dict]]:
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    procs, threads, tracks = {}, {}, {}
    for e in events:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in e, f"event without {key!r}: {e}"
        assert e["ph"] in ("X", "M", "i"), e
        if e["ph"] == "M":
            if e["name"] == "process_name":
                procs[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    out = {}
    for (pid, tid), evs in tracks.items():
        assert pid in procs and (pid, tid) in threads, f"events on an unnamed track {(pid, tid)}"
        spans = sorted((e for e in evs if e["ph"] == "X"), key=lambda e: (_ns(e["ts"]), -_ns(e["dur"])))
        open_ends: list[int] = []  # the ends of the spans that hold the current one
        for e in spans:
            start, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], \
                f"{threads[(pid, tid)]}: span {e['name']} [{start}, {end}] ns overlaps its outer span ({open_ends[-1]})"
            open_ends.append(end)
        out[(procs[pid], threads[(pid, tid)])] = sorted(evs, key=lambda e: e["ts"])
    for (pid, _), name in threads.items():
        out.setdefault((procs[pid], name), [])
    return out
