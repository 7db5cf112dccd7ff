"""Faults in a mixture of experts' regions on the tile actors: a dead core in an expert's block and a dead
tile holding experts are found and recovered from (the layer region is re-planned around them, experts
and all) with the reference's tokens."""

from __future__ import annotations

import pytest

from waferrt.core.mesh import Coord, MeshSpec
from waferrt.core.spec import TINY
from waferrt.decode.moe_layout import expert_blocks
from waferrt.faults import CoreFailure, FaultPlan, TileCrash, Trigger
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_moe_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest

CFG = tiny_moe_config(n_experts=4, top_k=2)
WEIGHTS = synthetic_llama(CFG, seed=0)
REQUESTS = [GenRequest((5, 6, 7), 12), GenRequest((9,), 10)]
SAMPLER = Sampler(temperature=0.8, top_p=0.9, seed=5)

PLACEMENT = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(48, 2))  # for the llm and want fixtures (conftest)


def _expert_core(llm: WaferLLM, layer: int, expert: int) -> Coord:
    """A live core of the block that holds `expert` in `layer`'s region now."""
    p = llm.placement
    block = expert_blocks(CFG.n_experts, p.layers[layer], p.experts)[expert]
    return next(c for c in block.cores() if c not in p.mesh.dead)


def test_a_dead_core_in_an_experts_block_is_recovered_with_the_same_tokens(llm, want):
    fault = CoreFailure(_expert_core(llm, 1, 3), Trigger(step=4))
    with llm.faults(FaultPlan((fault,), seed=1)) as session:
        got, _ = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.outcome == "recovered" and "core failed" in event.detected_by, session.log.table()
    assert fault.core not in set().union(*(set(r.cores()) for r in llm.placement.layers))


def test_a_dead_tile_holding_experts_is_recovered_with_the_same_tokens(llm, want):
    tile = llm.placement.mesh.tile_of(_expert_core(llm, 0, 0))
    if tile == llm.head:
        pytest.skip("layer 0's experts share the head's tile here")
    with llm.faults(FaultPlan((TileCrash(tile, Trigger(step=5)),), seed=2)) as session:
        got, _ = llm.generate(REQUESTS, SAMPLER)
    assert [c.tokens for c in got] == want
    (event,) = session.log.events
    assert event.outcome == "recovered", session.log.table()


def test_a_chaos_run_on_the_moe_model_is_identical(ray_session, capsys):
    """`waferrt chaos --model tinymoe` (a seeded small sample): every fault that fires is recovered from and
    the tokens equal the fault-free run's."""
    import json

    from waferrt.cli import main

    assert main(["chaos", "--model", "tinymoe", "--faults", "2", "--seed", "3", "--kinds", "core,tile",
                 "--max-new-tokens", "6", "--requests", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["identical"] and report["error"] is None and report["injected"] == 2, report
    assert all(f["outcome"] in ("recovered", "did not fire") for f in report["faults"]), report
