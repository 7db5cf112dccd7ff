"""Parallelism strategies run in the emulator: the same tokens as the reference, one region per group of layers,
SRAM booked as planned, and the planner's pick by objective (with its reasons).

- layer-pipelined regions, groups of layers per region and one region for every layer (WaferLLM-style tensor
  parallelism) decode the tiny model on the loop fabric with the reference's tokens (seeded sampling);
- the tiles of a group's region book what the planner budgets for it (its layers' weights and K/V, one
  scratch area);
- ``choose`` keeps the best candidate for the objective and names the others with their numbers;
- ``--strategy`` text is read or refused with what to write.
"""

from __future__ import annotations

import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.decode import layout as dl
from waferrt.decode.setup import stage_sram
from waferrt.decode.stage import StageKind
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, PlanOptions, Strategy, plan, violations
from waferrt.scheduler.strategies import choose, parse_strategy
from waferrt.scheduler.types import Objective
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
MESH, KV = MeshSpec(16, 16, 8, 8), KVReserve(32, 4)


@pytest.mark.parametrize("group", [1, 2, 3])
def test_every_strategy_decodes_the_reference_tokens(group):
    p = plan(CFG, TINY, MESH, kv=KV, options=PlanOptions(strategy=Strategy(group, CFG.n_layers)))
    assert violations(p) == () and p.group == group
    assert [name for name, _ in p.regions()[1:]] == {1: ["layer 0", "layer 1", "layer 2"], 2: ["layers 0-1", "layer 2"],
                                                     3: ["layers 0-2"]}[group]
    requests = [GenRequest((5 + i, 9, 2), 6) for i in range(3)]
    sampler = Sampler(temperature=0.8, seed=3)
    out, _ = LocalDecoder(CFG, W, p).generate(requests, sampler)
    ref, _ = generate_reference(CFG, W, requests, sampler)
    assert [c.tokens for c in out] == [c.tokens for c in ref]


def test_a_groups_region_books_what_the_planner_budgets():
    p = plan(CFG, TINY, MESH, kv=KV, options=PlanOptions(strategy=Strategy(3, CFG.n_layers)))
    from waferrt.decode.setup import DecodeSetup

    setup = DecodeSetup.from_placement(p)
    booked = {}
    for s, stage in enumerate(setup.stages()):
        if stage.kind is StageKind.LAYER:
            booked.update(stage_sram(setup, s))
    assert sorted(booked) == ["layer0.kv", "layer0.scratch", "layer0.weights", "layer1.kv", "layer1.weights",
                              "layer2.kv", "layer2.weights"]
    most = int(sum(nbytes for _, nbytes in booked.values()).max())
    assert most == dl.layer_core_bytes(CFG, p.layers[0], p.kv_tokens, KV.requests, p.dtype, layers=3) <= TINY.sram_bytes


def test_choose_keeps_the_best_for_the_objective_and_says_why():
    for objective in ("latency", "throughput"):
        c = choose(CFG, TINY, KV, Objective(objective), lambda s: MESH)
        scores = [t.score(objective) for t in c.timed]
        assert scores == sorted(scores) and c.placement == c.timed[0].placement
        assert {t.strategy.group for t in c.timed} | {s.group for s, _ in c.refused} == {1, 2, 3}
        assert c.why.startswith(f"objective {objective}") and len(c.table().splitlines()) == 3
    tensor = choose(CFG, TINY, KV, Objective("latency", (Strategy(3, 3),)), lambda s: MESH)
    assert tensor.placement.group == 3 and "no other strategy fits" in tensor.why


def test_strategy_text_is_read_or_refused_with_what_to_write():
    assert parse_strategy("layer", 30) == [Strategy(1, 30)]
    assert parse_strategy("tensor", 30) == [Strategy(30, 30)]
    assert parse_strategy("grouped:15", 30) == [Strategy(15, 30)]
    assert {s.group for s in parse_strategy("grouped", 30)} == {2, 4, 8, 16}
    for bad in ("grouped:31", "grouped:0", "pipeline", "mixed", "tensor:2"):
        with pytest.raises(ValueError, match="use layer, tensor, grouped or grouped:N"):
            parse_strategy(bad, 30)
