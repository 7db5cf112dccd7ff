"""Traces through Ray: a decode on tile actors and kernels run with ``wafer.trace`` give Chrome / Perfetto
JSON with a track per tile and one for the host, spans that nest, what ran in them, and an arrow per message
between tiles (from the send on one tile to the wait on its neighbour that took it)."""

from __future__ import annotations

import json

import numpy as np
from tracecheck import check_handovers, check_messages, check_trace

from waferrt import Wafer
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
WALL = "wafer (emulator wall clock)"


def test_a_traced_decode_on_tile_actors(ray_session, tmp_path):
    mesh = MeshSpec(16, 16, 8, 8)
    placement = plan(CFG, TINY, mesh, kv=KVReserve(32, 2))
    requests = [GenRequest((5, 6, 7), 8), GenRequest((9,), 6)]
    want, _ = generate_reference(CFG, W, requests, Sampler())
    path = tmp_path / "decode.json"
    with WaferLLM(CFG, W, placement) as llm:
        got, stats = llm.generate(requests, Sampler(), trace=path)
        calls = llm.ray_calls
        _, again = llm.generate(requests, Sampler())  # tracing is off again: no trace, no extra calls
        assert again.trace is None and llm.ray_calls - calls == calls - 2 * len(mesh.tiles())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    tracks = check_trace(json.loads(path.read_text()))
    wall = {t: evs for (p, t), evs in tracks.items() if p == WALL}
    assert set(wall) == {"host"} | {str(t) for t in mesh.tiles()}
    compute = [e for evs in wall.values() for e in evs if e["cat"] == "compute"]
    assert sorted((e["args"]["mb"], e["args"]["stage"]) for e in compute) == sorted((r.mb, r.stage) for r in stats.runs)
    head = str(placement.mesh.tile_of(placement.embed.cores().__next__()))
    assert {e["name"] for e in wall[head]} >= {"embed", "head"}
    assert [e["name"] for e in wall["host"]].count("token") == sum(len(c.tokens) for c in got)
    assert any(e["cat"] == "wait" for t, evs in wall.items() if t != "host" for e in evs)
    assert any(p.startswith("modelled") for p, _ in tracks)
    arrows = check_handovers(json.loads(path.read_text()))  # the tiles' own sequence numbers pair them
    assert len(arrows) == sum(e["cat"] == "send" for evs in wall.values() for e in evs) > 0


def test_kernels_traced_with_wafer_trace(ray_session, tmp_path):
    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    path = tmp_path / "kernel.json"
    with Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2)) as wafer:
        wafer.dsm.alloc("x", x.shape, split=("y", "x", None))
        wafer.dsm.put("x", x)

        def row_sum(ctx):
            ctx.store("x", ctx.allreduce(ctx.load("x"), "x"))

        with wafer.trace(path):
            wafer.run(row_sum)
        wafer.run(row_sum)  # not traced
        assert np.allclose(wafer.dsm.get("x"), 4 * x.sum(1, keepdims=True).repeat(4, 1))  # twice: 4 cores
    tracks = check_trace(json.loads(path.read_text()))
    assert set(tracks) == {(WALL, "host"), (WALL, "tile(0,0)"), (WALL, "tile(1,0)")}
    assert [e["name"] for e in tracks[(WALL, "host")]] == ["run row_sum"]
    for tile in ("tile(0,0)", "tile(1,0)"):
        names = [e["name"] for e in tracks[(WALL, tile)]]
        assert names.count("kernel row_sum") == 1 and "allreduce.ktree" in names
        assert any(n.startswith("send ") for n in names) and any(n.startswith("wait ") for n in names)
    arrows = check_messages(json.loads(path.read_text()))  # every send joined to the wait that took it
    assert {(a.out_track[1], a.into_track[1]) for a in arrows} == {("tile(0,0)", "tile(1,0)"),
                                                                   ("tile(1,0)", "tile(0,0)")}
