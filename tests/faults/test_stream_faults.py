"""Faults in a weight-streaming decode on the tile actors: the region is re-planned and the weights stream again.

One tiny-model WaferLLM streams its weights from a MemoryX actor into one region of a mesh of two 6x8-core
tiles (room for another region). A dead core and then a dead link inside the region, mid-decode, move the
region (scheduler.placement.plan_streaming around them); the new region's tile attaches to a MemoryX started
for it and the old actor is gone; the tokens equal the numpy reference's. A crashed tile keeps its region
and the same MemoryX (none leaked). On the smallest streaming mesh (the region is the whole tile) a dead
core leaves no room: NoRoom says so in streaming terms, with the tokens made so far.
"""

from __future__ import annotations

import pytest
import ray

from waferrt.core.mesh import Coord, MeshSpec
from waferrt.core.spec import TINY
from waferrt.faults import CoreFailure, FaultPlan, LinkFailure, TileCrash, Trigger
from waferrt.faults.errors import NoRoom
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve
from waferrt.scheduler.placement import plan_streaming, streaming_mesh
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
WEIGHTS = synthetic_llama(CFG, seed=0)
KV = KVReserve(16, 3)
REQUESTS = [GenRequest((5, 6, 7), 12), GenRequest((100, 3), 9), GenRequest((9,), 10)]
SAMPLER = Sampler(temperature=0.8, top_p=0.9, seed=5)


@pytest.fixture(scope="module")
def llm(ray_session):
    with WaferLLM(CFG, WEIGHTS, plan_streaming(CFG, TINY, MeshSpec(12, 8, 6, 8), kv=KV)) as llm:
        yield llm


@pytest.fixture(scope="module")
def want():
    return [c.tokens for c in generate_reference(CFG, WEIGHTS, REQUESTS, SAMPLER)[0]]


def _gone(handle) -> bool:
    try:
        ray.get(handle.head_count.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


def _fault(kind: str, llm: WaferLLM):
    """A fault inside the streaming region now, firing a few steps in."""
    r = llm.placement.embed
    if kind == "core":
        return CoreFailure(Coord(r.x0 + 1, r.y0 + 1), Trigger(step=3))
    return LinkFailure(Coord(r.x0 + 2, r.y0 + 3), Coord(r.x0 + 2, r.y0 + 4), Trigger(step=4))


@pytest.mark.parametrize("kind", ["core", "link"])
def test_a_dead_core_or_link_in_the_region_moves_it_and_the_weights_stream_again(llm, want, kind):
    fault, before, memoryx = _fault(kind, llm), llm.placement.embed, llm.memoryx
    with llm.faults(FaultPlan((fault,), seed=1)) as session:
        got, _ = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.fault == fault and event.outcome == "recovered", session.log.table()
    assert f"{kind} failed in its region" in event.detected_by and "re-planned embed+layers 0-2+head" in event.action
    p = llm.placement
    assert p.streaming and p.embed != before and set(p.layers) == {p.embed}
    assert len(p.mesh.tiles_of(p.embed)) == 1 and llm.head == p.mesh.tiles_of(p.embed)[0]
    assert not any(p.embed.contains(c) for c in p.mesh.dead)
    assert not any(p.embed.contains(a) and p.embed.contains(b) for a, b in p.dead_links)
    assert llm.memoryx is not memoryx and _gone(memoryx)  # a MemoryX cut for the new region; the old one ended
    got, _ = llm.generate(REQUESTS, SAMPLER)  # and it serves the next run too
    assert [c.tokens for c in got] == want


def test_a_crashed_tile_keeps_its_region_and_its_memoryx(llm, want):
    region, memoryx = llm.placement.embed, llm.memoryx
    fault = TileCrash(llm.head, Trigger(step=3))
    with llm.faults(FaultPlan((fault,), seed=1)) as session:
        got, _ = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.outcome == "recovered", session.log.table()
    assert llm.placement.embed == region and llm.memoryx is memoryx and not _gone(memoryx)


def test_no_room_for_another_region_is_noroom_in_streaming_terms(ray_session):
    mesh = streaming_mesh(CFG, TINY, KV)  # one tile, all of it the region
    with WaferLLM(CFG, WEIGHTS, plan_streaming(CFG, TINY, mesh, kv=KV)) as llm:
        with llm.faults(FaultPlan((CoreFailure(Coord(1, 0), Trigger(step=3)),))), pytest.raises(NoRoom) as e:
            llm.generate(REQUESTS, SAMPLER)
    text = str(e.value)
    assert text.startswith("core (x=1, y=0) died and the weight-streaming decode no longer fits the wafer around them")
    assert "with core (x=1, y=0) dead, no region inside one 3x8 tile" in text and "a region of 3x8 cores" in text
    assert "resident" not in text and "spare cores" not in text and e.value.completions is not None
