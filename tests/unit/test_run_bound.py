"""The bound `waferrt generate` prints beside the modelled rate of what ran is a true bound of that run.

The run's rate is its flow schedule (waferrt.decode.schedule over the tiles' stage runs, every token timed at the
positions its request held); the bound (scheduler.speed.run_bound_tokens_per_s, via the CLI's
``generate_report.run_bound``) is derived from the same per-token cycles, at those positions and with as many
requests in flight as ran. Short requests on a large K/V reserve beat a bound taken at the full reserve (the bug:
"ran 2,772 tok/s, bound 2,355"), and so did an MoE run whose tokens routed more cheaply than the typical token
(experts 0..top_k-1: "ran 101,159 tok/s, bound 80,977"; the bound now takes decode.routed_cost.cheapest_routed_cycles);
here the tiles run without Ray (serving.LocalDecoder over a LoopFabric).
"""

from __future__ import annotations

import dataclasses

import pytest

from waferrt.cli.generate_report import run_bound
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY, WSE2
from waferrt.decode.cost import token_cost
from waferrt.decode.schedule import round_bound_seconds
from waferrt.decode.stage import entries
from waferrt.model import Sampler, synthetic_llama, tiny_config, tiny_moe_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, plan, run_bound_tokens_per_s
from waferrt.scheduler.speed import moe_share_floor, placement_stages
from waferrt.serving import Completion, GenRequest, LocalDecoder, logit_positions, most_items

ONE = (GenRequest((5,), 3),)
TWO = (GenRequest((5, 6, 7), 4), GenRequest((9,), 4))
THREE = (GenRequest(tuple(range(1, 20)), 6), GenRequest((9,), 8), GenRequest((3, 4), 5))
MODELS = {"dense": tiny_config(), "moe": tiny_moe_config()}
WEIGHTS = {name: synthetic_llama(config, seed=0) for name, config in MODELS.items()}


@pytest.mark.parametrize("mesh", [MeshSpec(16, 16, 8, 8), MeshSpec(8, 8, 8, 8)], ids=["2x2 tiles", "1 tile"])
@pytest.mark.parametrize("kv_tokens", [128])
@pytest.mark.parametrize("requests", [ONE, TWO, THREE], ids=["1 request", "2 requests", "3 requests"])
@pytest.mark.parametrize("model,prefill", [("dense", False), ("dense", True), ("moe", False)])
def test_the_printed_bound_is_never_beaten_by_the_run(mesh, kv_tokens, requests, model, prefill):
    placement = plan(MODELS[model], TINY, mesh, kv=KVReserve(kv_tokens, 2))
    out, stats = LocalDecoder(MODELS[model], WEIGHTS[model], placement).use_prefill(prefill).generate(
        list(requests), Sampler())
    bound = run_bound(placement, out)
    assert stats.wafer_tokens_per_s <= bound * (1 + 1e-9)
    if len(requests) == 1:  # one request alone: its tokens go round the chain one after another
        assert stats.wafer_tokens_per_s >= 0.9 * bound


def test_the_positions_are_those_whose_logits_gave_the_tokens():
    out = [Completion((1, 2, 3), [7, 8]), Completion((4,), [5, 6, 7, 8]), Completion((1,) * 9, [])]
    assert logit_positions(out) == range(0, 4)  # request 0: positions 2, 3; request 1: 0 to 3; request 2: none
    assert not logit_positions([Completion((1, 2), [])])
    assert run_bound(plan(MODELS["dense"], TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2)),
                      [Completion((1, 2), [])]) is None


def test_an_moe_bound_shares_the_experts_over_the_tokens_a_micro_batch_can_carry():
    """A micro-batch carries at most every request's prompt (its last token gives a token) or next token: here
    3 + 1 + 9 = 13. Tokens that share a micro-batch share its MoE layers' routed work, so the bound over
    micro-batches of up to 13 tokens is above the one-token bound; a dense model's bound does not move."""
    out = [Completion((1, 2, 3), [7, 8]), Completion((4,), [5, 6, 7, 8]), Completion((1,) * 9, [])]
    assert most_items(out) == 13
    for model, more in (("moe", True), ("dense", False)):
        p = plan(MODELS[model], TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(128, 2))
        one, many = (run_bound_tokens_per_s(p, 2, range(0, 4), b) for b in (1, 13))
        assert (many > one) if more else (many == one)


SLOW_ROUTER = dataclasses.replace(TINY, beta_cycles=200.0)  # a K/V shift dearer than a position more per core


@pytest.mark.parametrize("positions", [range(0, 1), range(3, 9), range(5, 70), range(29, 150)])
@pytest.mark.parametrize("config,spec,mesh", [
    (tiny_config(), TINY, MeshSpec(16, 16, 8, 8)), (tiny_moe_config(), TINY, MeshSpec(24, 16, 8, 8)),
    (tiny_config(), SLOW_ROUTER, MeshSpec(16, 16, 8, 8)), (SMOLLM2_135M, WSE2, MeshSpec(174, 128, 87, 64))],
    ids=["tiny", "tinymoe", "slow router", "smollm2"])
def test_the_bound_takes_every_stage_at_its_cheapest_position(config, spec, mesh, positions):
    """run_bound_tokens_per_s looks at two positions per stage (the first, the first without a K/V shift):
    the same as scanning every position (with a slow router the second is the cheaper); an MoE layer's routed
    work at its cheapest routing (moe_share_floor, micro-batches of one token)."""
    p = plan(config, spec, mesh, kv=KVReserve(256, 8))
    stages = placement_stages(p)
    alone = [min(token_cost(spec, p.decoding, entry, pos, True).cycles for pos in positions)
             + moe_share_floor(p, stage, 1) for stage, entry in zip(stages, entries(stages), strict=True)]
    for in_flight in (1, 3, 8):
        scan = in_flight / round_bound_seconds(alone, [st.region for st in stages], in_flight, spec.clock_hz)
        assert run_bound_tokens_per_s(p, in_flight, positions, 1) == pytest.approx(scan, rel=1e-12)
