"""Seeded faults in a decode on the tile actors: every kind is found and recovered from with nothing lost.

One tiny-model WaferLLM (4 tiles of 8x8 cores) serves every test; the faults are placed on what the decode
uses at the time (its placement moves as recoveries re-plan it). Each test compares the tokens -- sampled
at temperature 0.8 from seeded RNGs, so a replay that drew its random numbers again would show -- with
the numpy reference's, and reads the fault's event: what found it and what recovery did. Then the
policies: fail-fast stops at the first fault with FaultStop; more dead cores than the wafer has room for
end in Unrecoverable naming what died, with the tokens made so far attached, and so does a repair that fails
for a reason that is no fault (at once, not in a retry loop).
"""

from __future__ import annotations

import pytest

from waferrt.core.mesh import Coord, MeshSpec, TileId
from waferrt.core.spec import TINY
from waferrt.decode.program import crossings
from waferrt.faults import CoreFailure, Corrupt, FaultPlan, LinkFailure, Straggler, TileCrash, Trigger
from waferrt.faults.errors import FaultStop, NoRoom, Unrecoverable
from waferrt.faults.model import border_links
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import Batch, GenRequest, serve

CFG = tiny_config()
WEIGHTS = synthetic_llama(CFG, seed=0)
REQUESTS = [GenRequest((5, 6, 7), 14), GenRequest((100, 3), 9), GenRequest((9,), 16)]
SAMPLER = Sampler(temperature=0.8, top_p=0.9, seed=5)

PLACEMENT = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(48, 3))  # for the llm and want fixtures (conftest)


def _live_core(llm: WaferLLM, layer: int) -> Coord:
    """A core of the layer's region now (not a dead one)."""
    r, p = llm.placement.layers[layer], llm.placement
    return next(c for c in r.cores() if c not in p.mesh.dead)


def _fault(kind: str, llm: WaferLLM):
    """A fault of `kind` on what the decode uses now, firing a few steps in."""
    c = _live_core(llm, 1)
    if kind == "core":
        return CoreFailure(c, Trigger(step=4))
    if kind == "link":
        r = llm.placement.layers[2]
        return LinkFailure(Coord(r.x0, r.y0), Coord(r.x0 + 1, r.y0), Trigger(step=5))
    if kind == "corrupt":
        a, b = border_links(llm.placement.mesh, crossings(llm.setup))[0]
        return Corrupt(a, b, 2, Trigger(step=3))
    if kind == "straggler":
        return Straggler(TileId(1, 0), 0.01, Trigger(step=2))
    if kind == "slow core":  # holds up its region (layer 1): the pace of the tile that runs it shows it
        return Straggler(core=c, delay=0.03, when=Trigger(step=2))
    return TileCrash(next(t for t in llm.placement.mesh.tiles() if t != llm.head), Trigger(step=5))


FOUND_BY = {"core": "core failed", "link": "link failed", "corrupt": "checksum", "straggler": "pace",
            "slow core": "pace", "tile": ""}


@pytest.mark.parametrize("kind", ["core", "link", "corrupt", "straggler", "slow core", "tile"])
def test_each_kind_is_found_and_recovered_with_the_same_tokens(llm, want, kind):
    fault = _fault(kind, llm)
    with llm.faults(FaultPlan((fault,), seed=1)) as session:
        got, stats = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.fault == fault and event.step >= 1 and event.outcome == "recovered", session.log.table()
    assert FOUND_BY[kind] in event.detected_by and event.action
    assert stats.faults == session.log.events


def test_a_fault_armed_on_a_running_decode_with_no_plan_is_its_own_event(llm, want):
    """As ``waferrt serve --http-faults`` arms one: no FaultPlan around the decode. The fault is in the decode's
    log as soon as it is armed (the live page lists it), and when it fires it is that event that is detected and
    recovered (before, it went to a session of the wafer's own that the decode never read)."""
    decode = llm.decoder()
    fault = CoreFailure(_live_core(llm, 1), Trigger(step=4))
    try:
        i = decode.inject(fault)
        assert [(e.fault, e.outcome) for e in decode.log.events] == [(fault, "did not fire")]
        got, _ = serve(decode, llm.setup, llm.placement.spec.clock_hz, Batch(tuple(REQUESTS), SAMPLER))
    finally:
        llm.wafer.session = None  # the next test's decode starts without faults
    assert [c.tokens for c in got] == want
    (event,) = decode.log.events
    assert event.index == i and event.outcome == "recovered" and "core failed" in event.detected_by, \
        decode.log.table()


def test_a_straggler_in_the_last_step_is_found_all_the_same(llm, want):
    """Beats come every 0.25 s: a straggler that fires at its tile's last micro-batch shows in none. The host
    asks the tiles' paces once more when the decode ends, so it is found (not "fired, not detected")."""
    _, stats = llm.generate(REQUESTS, SAMPLER)
    tail = llm.placement.layers[-1]
    tile = llm.placement.mesh.tile_of(Coord(tail.x0, tail.y0))
    last = len({r.mb for r in stats.runs if llm.placement.mesh.tile_of(Coord(r.region.x0, r.region.y0)) == tile})
    fault = Straggler(tile, 0.05, Trigger(step=last))
    with llm.faults(FaultPlan((fault,), seed=1)) as session:
        got, _ = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.outcome == "recovered" and "pace" in event.detected_by, session.log.table()


def test_fail_fast_stops_at_the_first_fault_with_what_was_made(llm, want):
    """The fault fires at layer 0's ninth micro-batch: each of the three requests' third pass, so the host has
    had two rounds of the pipeline to receive tokens (at the third micro-batch, the first pass, the head's
    first token and the fault raced: on a loaded machine the fault came first and nothing had been made)."""
    fault = CoreFailure(_live_core(llm, 0), Trigger(step=9))
    with llm.faults(FaultPlan((fault,), policy="fail-fast")), pytest.raises(FaultStop, match=str(fault.core)) as e:
        llm.generate(REQUESTS, SAMPLER)
    made = [c.tokens for c in e.value.completions]
    assert "fail-fast" in str(e.value) and sum(map(len, made)) >= 1
    assert all(m == w[:len(m)] and len(m) < len(w) for m, w in zip(made, want, strict=True)), (made, want)
    got, stats = llm.generate(REQUESTS, SAMPLER)  # the core stays dead; this run finds it and recovers
    assert [c.tokens for c in got] == want and stats.faults[0].detected_by.startswith("core failed"), stats.faults


def test_a_repair_that_fails_for_no_fault_is_unrecoverable_at_once(llm, want, monkeypatch):
    """A re-plan that raises something other than a fault (here: one the decode could not run) would fail the
    same way every time: the recovery ends at once in Unrecoverable naming it, never in a retry loop."""
    import time

    import waferrt.recovery

    def replan(*args, **kw):
        raise ValueError("layer 0 would span 2 tiles")

    monkeypatch.setattr(waferrt.recovery, "replan", replan)
    t0 = time.monotonic()
    with llm.faults(FaultPlan((CoreFailure(_live_core(llm, 1), Trigger(step=3)),))), \
            pytest.raises(Unrecoverable, match="ValueError: layer 0 would span 2 tiles"):
        llm.generate(REQUESTS, SAMPLER)
    assert time.monotonic() - t0 < 30
    monkeypatch.undo()
    got, _ = llm.generate(REQUESTS, SAMPLER)  # the wafer is still usable: this run finds the core and re-plans
    assert [c.tokens for c in got] == want


def test_more_dead_cores_than_room_is_unrecoverable_and_says_what_died(llm):
    p = llm.placement
    used = {c for r in (p.embed, *p.layers) for c in r.cores()}
    spares = sorted(set(p.mesh.region.cores()) - p.mesh.dead - used)  # they die at once: no room is left
    plan_ = FaultPlan((*(CoreFailure(c) for c in spares), CoreFailure(_live_core(llm, 0), Trigger(step=2))))
    with llm.faults(plan_), pytest.raises(NoRoom) as e:
        llm.generate(REQUESTS, SAMPLER)
    assert "dead" in str(e.value) and e.value.completions is not None
