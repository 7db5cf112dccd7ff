"""The trace recorder and a traced decode without Ray: Chrome / Perfetto JSON with the format's fields, one
track per tile and one for the host, spans that nest, and what the spans say (every stage run, every
micro-batch, sends and waits, every token) matching what ran; faults as instants on a tile's track."""

from __future__ import annotations

import json
import time

import pytest
from tracecheck import check_flows, check_handovers, check_trace

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.core.trace import Flow, Process, Recorder, Span, chrome_trace, message_flows
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


def test_recorder_spans_nest_and_convert_to_whole_microseconds():
    rec = Recorder("tile(0,0)")
    with rec.span("outer", "compute", mb=1):
        with rec.span("inner", "send", bytes=8):
            time.sleep(0.001)
        rec.instant("fault", "fault", kind="core", core="(1,2)")
    rec.add("later", "wait", rec.last_end_ns, rec.last_end_ns + 2500)
    assert rec.idle_since(0) == rec.last_end_ns
    doc = chrome_trace([Process("p", ((rec.track, tuple(rec.events)),), origin_ns=rec.events[0].start_ns)])
    tracks = check_trace(doc)
    (evs,) = tracks.values()
    by = {e["name"]: e for e in evs}
    assert by["outer"]["ts"] <= by["inner"]["ts"] and by["inner"]["dur"] >= 1000  # microseconds
    assert by["fault"]["ph"] == "i" and by["fault"]["args"] == {"kind": "core", "core": "(1,2)"}
    assert all(isinstance(e["ts"], int) for e in evs)
    assert rec.take() and rec.events == [] and rec.last_end_ns == 0
    with pytest.raises(ValueError, match="ends .* before it starts"):
        rec.add("bad", "x", 10, 5)


def test_the_nesting_check_catches_a_partial_overlap():
    spans = (Span("a", "c", 0, 5000), Span("b", "c", 3000, 8000))
    with pytest.raises(AssertionError, match="overlaps"):
        check_trace(chrome_trace([Process("p", (("t", spans),))]))


def _send(tag, to, seq, start, end):
    return Span(f"send {tag}", "send", start, end, (("link", "E"), ("tag", tag), ("to", to), ("seq", seq)))


def _wait(tag, frm, seq, start, end):
    return Span(f"wait {tag}", "wait", start, end, (("link", "W"), ("tag", tag), ("from", frm), ("seq", seq)))


def test_messages_pair_by_tiles_sequence_number_and_tag_and_become_arrows():
    a = (Span("kernel", "kernel", 0, 90_000),
         _send("x", "B", 1, 1_000, 3_000),  # taken by B's first wait
         _send("y", "B", 2, 4_000, 4_400),  # never taken: no arrow
         _send("z", "B", 5, 10_000, 10_500),  # lost with its receiver (not taken) ...
         _send("x", "B", 1, 50_000, 52_000),  # the link was rewired: numbered 1 again, seconds later
         _send("z", "B", 5, 60_000, 60_500))  # ... and the same number and tag again after the rewiring
    b = (_wait("x", "A", 1, 500, 3_200),  # began before the send, ended after it began
         _wait("x", "C", 1, 6_000, 7_000),  # from another tile: not A's message
         Span("compute", "compute", 7_000, 49_000),
         _wait("x", "A", 1, 51_000, 60_000),
         _wait("z", "A", 5, 60_000, 61_000))
    flows = message_flows((("A", a), ("B", b)))
    assert flows == [Flow("x", ("A", 1), ("B", 0)), Flow("x", ("A", 4), ("B", 3)), Flow("z", ("A", 5), ("B", 4))]
    doc = chrome_trace([Process("p", (("A", a), ("B", b)))])
    arrows = check_flows(doc)
    assert [(x.name, x.out["ts"], x.into["ts"]) for x in arrows] == [("x", 1, 0), ("x", 50, 51), ("z", 60, 60)]
    assert len({x.id for x in arrows}) == 3 and all(x.finish["bp"] == "e" for x in arrows)
    assert [x.finish["ts"] for x in arrows] == [2.5, 59.5, 60.5]  # in the wait, half a microsecond before its end


def test_the_flow_check_catches_broken_arrows():
    a, b = (("A", (_send("x", "B", 1, 1_000, 3_000),)), ("B", (_wait("x", "A", 1, 2_000, 9_000),)))
    good = chrome_trace([Process("p", (a, b))])
    check_flows(good)
    flows = [e for e in good["traceEvents"] if e["ph"] in "sf"]
    for broken, says in ((lambda s, f: f.update(ts=0.5), "finishes .* before it starts"),
                         (lambda s, f: f.update(id=99), "1 starts and 0 finishes"),
                         (lambda s, f: s.update(ts=0.5), "starts at 0.5 outside every span"),
                         (lambda s, f: f.update(ts=20), "finishes at 20 where no span"),
                         (lambda s, f: f.update(cat="other"), "differ in cat or name")):
        doc = json.loads(json.dumps(good))
        start, finish = (e for e in doc["traceEvents"] if e["ph"] in "sf")
        broken(start, finish)
        with pytest.raises(AssertionError, match=says):
            check_flows(doc)
    assert len(flows) == 2


def test_a_traced_local_decode(tmp_path):
    mesh = MeshSpec(16, 16, 8, 8)
    placement = plan(CFG, TINY, mesh, kv=KVReserve(32, 2))
    requests = [GenRequest((5, 6, 7), 6), GenRequest((100, 3), 5)]
    sampler = Sampler(temperature=0.9, top_k=30, seed=1)
    want, _ = generate_reference(CFG, W, requests, sampler)
    dec = LocalDecoder(CFG, W, placement)
    path = tmp_path / "trace.json"
    got, stats = dec.generate(requests, sampler, trace=path)
    assert [c.tokens for c in got] == [c.tokens for c in want]  # tracing changes nothing
    tracks = check_trace(json.loads(path.read_text()))
    wall = {t: evs for (p, t), evs in tracks.items() if p.startswith("wafer")}
    assert set(wall) == {"host"} | {str(t) for t in mesh.tiles()}  # one track per tile, and the host
    host = [e["name"] for e in wall["host"]]
    assert {"start", "submit", "stop", "decode"} <= set(host)
    assert host.count("token") == sum(len(c.tokens) for c in got)
    compute = [e for evs in wall.values() for e in evs if e["cat"] == "compute"]
    assert len(compute) == len(stats.runs)  # a span per stage run, with what it ran
    assert sorted((e["args"]["mb"], e["args"]["stage"], e["args"]["tokens"]) for e in compute) == \
        sorted((r.mb, r.stage, len(r.items)) for r in stats.runs)
    cats = {e["cat"] for evs in wall.values() for e in evs}
    assert {"compute", "microbatch", "send", "wait"} <= cats
    arrows = check_handovers(json.loads(path.read_text()))  # every hop of every hand-over is an arrow
    assert len(arrows) == sum(e["cat"] == "send" for evs in wall.values() for e in evs) > 0
    modelled = {t: evs for (p, t), evs in tracks.items() if p.startswith("modelled")}
    assert len(modelled) == len(CFG_REGIONS(placement))
    n_tasks = sum(len(r.items) for r in stats.runs)
    assert sum(len(evs) for evs in modelled.values()) == n_tasks
    last_end = max(e["ts"] + e["dur"] for evs in modelled.values() for e in evs)
    assert last_end == pytest.approx(stats.modelled_s * 1e6, rel=1e-6, abs=1e-3)
    # tracing off: nothing recorded, the links are the plain ones again
    assert all(p.trace is None and type(p.links).__name__ == "LoopLinks" for p in dec.programs.values())
    _, plain = dec.generate(requests, sampler)
    assert plain.trace is None


def CFG_REGIONS(placement) -> set:
    return {placement.embed, *placement.layers}


def test_faults_are_instants_on_a_tile_track(tmp_path):
    placement = plan(CFG, TINY, MeshSpec(16, 8, 8, 8), kv=KVReserve(32, 2))
    _, stats = LocalDecoder(CFG, W, placement).generate([GenRequest((5,), 3)], Sampler(), trace=True)
    stats.trace.instant("core failure", "tile(1,0)", core="(9,3)")
    stats.trace.instant("recovered", None, cat="recovery", seconds=0.5)
    tracks = check_trace(json.loads(stats.trace.write(tmp_path / "t.json").read_text()))
    fault = [e for e in tracks[("wafer (emulator wall clock)", "tile(1,0)")] if e["ph"] == "i"]
    assert [(e["name"], e["cat"], e["args"]) for e in fault] == [("core failure", "fault", {"core": "(9,3)"})]
    assert any(e["name"] == "recovered" for e in tracks[("wafer (emulator wall clock)", "host")])
    assert stats.trace.busy_s()["tile(0,0)"] > 0
