"""A fault during the prefill (waferrt.decode.prefill) on the tile actors is found and recovered from like any
other, with the reference's tokens: the whole prompts' micro-batch is the first each tile runs, and the
faults fire at it."""

from __future__ import annotations

import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.faults import CoreFailure, FaultPlan, TileCrash, Trigger
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
WEIGHTS = synthetic_llama(CFG, seed=0)
REQUESTS = [GenRequest(tuple(range(5, 30)), 8), GenRequest((100, 3, 7, 9), 6)]
SAMPLER = Sampler(temperature=0.8, top_p=0.9, seed=5)


@pytest.fixture(scope="module")
def llm(ray_session):
    placement = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(48, 2))
    with WaferLLM(CFG, WEIGHTS, placement).use_prefill() as llm:
        yield llm


@pytest.mark.parametrize("kind", ["core", "tile"])
def test_a_fault_in_the_prefill_is_recovered_with_the_reference_tokens(llm, kind):
    want = [c.tokens for c in generate_reference(CFG, WEIGHTS, REQUESTS, SAMPLER)[0]]
    region = llm.placement.layers[1]
    tile = next(t for t in llm.setup.stage_tiles()[1:-1] if t != llm.head)  # a layer's tile, not the head's
    fault = CoreFailure(next(iter(region.cores())), Trigger(step=1)) if kind == "core" else \
        TileCrash(tile, Trigger(step=1))
    with llm.faults(FaultPlan((fault,), seed=1)) as session:
        got, stats = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.fault == fault and event.outcome == "recovered", session.log.table()
    assert set(stats.ttft_wall_s) == {0, 1}
