"""The whole wafer on paper: the estimator against the emulator, its fit, its choices, streaming and the sweep.

- the estimator's timing of a planned placement is what the emulator's tiles book running it (one request
  and several in flight), on a tiny mesh and on SmolLM2's default wse2 mesh;
- its closed-form SRAM per core is the tiles' booking (decode.layout) wherever the emulated layout applies;
- a 750x994 wafer is answered by timing a bounded number of floor plans (never core by core);
- a model that does not fit says so and what would, and what it names does fit;
- the strategy it picks is the best of the candidates for the objective (or of those asked for, named as
  ``--strategy`` names them: layer, tensor, grouped); streaming is ingress-bound;
- the sweep's area model reproduces the WSE-2 die and its best design is within the budget.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from waferrt.core.mesh import Extent, MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode import layout as dl
from waferrt.decode.decoding import Decoding
from waferrt.decode.schedule import requests_round_seconds, round_bound_seconds, round_seconds
from waferrt.estimator import estimate as est
from waferrt.estimator import sweep as sw
from waferrt.estimator import wafer
from waferrt.estimator.streaming import streaming
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.model.zoo import MODELS, model_by_name
from waferrt.scheduler import KVReserve, PlanOptions, default_mesh, plan, speed
from waferrt.scheduler.strategies import parse_strategy, worth_trying
from waferrt.scheduler.types import OBJECTIVES, Strategy, Workload
from waferrt.serving import GenRequest, LocalDecoder

CFG = tiny_config()
LLAMA3 = MODELS["llama3-8b"].config
QWEN72 = MODELS["qwen2-72b"].config


def _emulated(p, requests: int) -> tuple[float, float]:
    """Modelled seconds of a steady round the tiles book decoding one request, and `requests` together
    (one-token prompts, four tokens each: the last round's caches are as full as the estimate assumes)."""
    out = []
    for n in (1, requests):
        dec = LocalDecoder(p.config, synthetic_llama(p.config, seed=0), p)
        _, stats = dec.generate([GenRequest((3 + i,), 4) for i in range(n)], Sampler())
        out.append(round_seconds(stats.runs, len(dec.setup.stages()) - 1, p.spec.clock_hz))
    return out[0], out[1]


@pytest.mark.parametrize("config,spec,kv,group", [(CFG, TINY, KVReserve(32, 4), 1), (CFG, TINY, KVReserve(32, 4), 2),
                                               (CFG, TINY, KVReserve(32, 4), 3),
                                               (SMOLLM2_135M, WSE2, KVReserve(512, 8), 1)])
def test_the_estimate_of_a_placement_is_what_the_emulator_books(config, spec, kv, group):
    """Every strategy the emulator runs (layer regions, groups, one region for all layers): the same mesh and
    model give the same time per token, emulated and estimated."""
    mesh = MeshSpec(16, 16, 8, 8) if config is CFG else default_mesh(config, spec, kv)
    p = plan(config, spec, mesh, kv=kv, options=PlanOptions(strategy=Strategy(group, config.n_layers)))
    requests = 3
    one, many = _emulated(p, requests)
    want_one, want_many = speed.placement_seconds(p, requests, context=4)  # the last round: 4 positions held
    assert one == pytest.approx(want_one, rel=1e-9)  # the brief asks 1%; the closed forms are exact
    assert many == pytest.approx(want_many, rel=1e-9)


def test_closed_form_sram_is_what_the_tiles_book():
    for config, (w, h), kv, r, dtype in itertools.product(
            [CFG, SMOLLM2_135M, LLAMA3], [(1, 1), (3, 2), (7, 5), (64, 16), (300, 32)], [64, 700, 4096], [1, 3],
            ["float32", "bfloat16"]):
        shape = wafer.Shape(w, h)
        if wafer.legal(config, shape, kv):
            assert wafer.layer_core_bytes(Workload(config, KVReserve(kv, r), dtype), shape) == dl.layer_core_bytes(
                config, Region(0, 0, w, h), kv, r, dtype), (config.dim, w, h, kv, r, dtype)
    # g layers stack their weights and K/V on the same cores; the scratch is there once
    work, shape = Workload(SMOLLM2_135M, KVReserve(512, 2), "float16"), wafer.Shape(30, 12, 3)
    one, scratch = wafer.layer_core_bytes(work, shape), wafer.layer_core_bytes(work, shape, kv=False, weights=False)
    assert wafer.layer_core_bytes(replace(work, layers=4), shape) == 4 * (one - scratch) + scratch


def test_the_planner_skips_only_floor_plans_that_cannot_win():
    """best() schedules only what its bound says can win: the same pick as scheduling every floor plan, and
    the bound is never above the scheduled round."""
    kv = KVReserve(256, 6)
    for s in worth_trying(SMOLLM2_135M.n_layers)[:2]:
        floors = list(wafer.floors(SMOLLM2_135M, WSE2, Extent(128, 96), kv, "float16", s))[::4]
        rounds = []
        for f in floors:
            stages = f.stages(SMOLLM2_135M.n_layers, s.group)
            dec = Decoding(SMOLLM2_135M, "float16", head_groups=f.shape.head_groups)
            seg = speed.stages_alone_cycles(WSE2, dec, stages, kv.tokens), [st.region for st in stages]
            rounds.append(requests_round_seconds(*seg, kv.requests, WSE2.clock_hz))
            assert round_bound_seconds(*seg, kv.requests, WSE2.clock_hz) <= rounds[-1] * (1 + 1e-12)
        got = est.best(Workload(SMOLLM2_135M, kv, "float16", s.group), WSE2, Extent(128, 96), "throughput")
        assert got.step_s == min(speed.stage_seconds(WSE2, Decoding(SMOLLM2_135M, "float16",
                                                                  head_groups=f.shape.head_groups),
                                                   f.stages(SMOLLM2_135M.n_layers, s.group), kv.tokens, kv.requests)[1]
                                 for f in wafer.floors(SMOLLM2_135M, WSE2, Extent(128, 96), kv, "float16", s))


def test_a_whole_wafer_is_answered_from_a_bounded_number_of_floor_plans():
    kv = KVReserve(4096, 8)
    for s in worth_trying(LLAMA3.n_layers):
        floors = list(wafer.floors(LLAMA3, WSE2, WSE2.full_mesh, kv, "float16", s))
        assert len(floors) < 400  # closed-form shapes: never a search over the 745,500 cores
    e = replace(est.estimate(LLAMA3, WSE2, WSE2.full_mesh, kv, "float16"), label="Llama3-8B")
    assert e.fits and 0 < e.cores_used <= 750 * 994 and e.sram_used_bytes <= 750 * 994 * WSE2.sram_bytes
    assert e.layer_core_bytes <= WSE2.sram_bytes and e.kv_tokens_per_request >= 4096
    assert e.time_per_token_s == pytest.approx(sum(e.breakdown_s.values()))
    assert e.tokens_per_s > e.request_tokens_per_s  # 8 in flight overlap in the pipeline of regions
    doc = e.to_json()
    for key in ("tokens_per_s", "time_per_token_s", "cores_used", "sram_used_bytes", "kv_capacity_tokens",
                "breakdown_s", "strategy", "why"):
        assert key in doc
    assert set(doc["breakdown_s"]) == {"gemv", "allreduce", "attention", "elementwise", "handover", "alltoall", "host"}


def test_what_does_not_fit_says_so_and_what_would():
    e = est.estimate(QWEN72, WSE2, WSE2.full_mesh, KVReserve(4096, 8), "float16")
    assert not e.fits and e.tokens_per_s == 0 and "DOES NOT FIT" in e.text()
    assert any("wafers" in a for a in e.advice) and any("--streaming" in a for a in e.advice)
    small, kv = Extent(140, 140), KVReserve(4096, 4)
    e = est.estimate(SMOLLM2_135M, WSE2, small, kv, "float32")
    assert not e.fits
    tokens = next(int(a.split("--kv-tokens ")[1].split()[0]) for a in e.advice if "--kv-tokens" in a)
    assert est.estimate(SMOLLM2_135M, WSE2, small, KVReserve(tokens, 4), "float32").fits  # what it names fits
    assert not est.estimate(SMOLLM2_135M, WSE2, small, KVReserve(tokens + 1, 4), "float32").fits  # the most
    assert any("--dtype float16" in a for a in e.advice) and any("--requests 1 fits" in a for a in e.advice)
    assert est.estimate(SMOLLM2_135M, WSE2, small, kv, "bfloat16").fits


def test_the_planner_picks_the_best_strategy_for_the_objective():
    kv = KVReserve(2048, 16)
    for objective in OBJECTIVES:
        e = est.estimate(SMOLLM2_135M, WSE2, WSE2.full_mesh, kv, "float16", est.Objective(objective))
        cands = [c for s in worth_trying(SMOLLM2_135M.n_layers)
                 if (c := est.best(Workload(SMOLLM2_135M, kv, "float16", s.group), WSE2, WSE2.full_mesh, objective))]
        assert len(cands) > 2 and objective in e.why
        if objective == "latency":
            assert e.time_per_token_s - est.host_seconds(SMOLLM2_135M, WSE2, 1) == pytest.approx(
                min(c.latency_s for c in cands))
        else:
            assert e.step_s - est.host_seconds(SMOLLM2_135M, WSE2, kv.requests) == pytest.approx(
                min(c.step_s for c in cands))
    asked = est.estimate(SMOLLM2_135M, WSE2, WSE2.full_mesh, kv, "float16",
                         est.Objective(tried=parse_strategy("tensor", 30)))
    assert asked.strategy.group == 30 and asked.shape is not None and "as asked" in asked.why
    grouped = est.estimate(SMOLLM2_135M, WSE2, WSE2.full_mesh, kv, "float16",
                           est.Objective(tried=parse_strategy("grouped", 30)))
    assert grouped.strategy.kind == "grouped" and "best is grouped" in grouped.why
    assert "tried only grouped strategies, as asked" in grouped.why


def test_strategy_values_and_errors():
    assert [Strategy(g, 30).kind for g in (1, 4, 29, 30)] == ["layer", "grouped", "grouped", "tensor"]
    assert [Strategy(g, 30).describe() for g in (1, 30, 4)] == [
        "layer (30 layer regions, one layer each)", "tensor (one region runs all 30 layers)",
        "grouped (8 regions of 4 layers)"]
    assert Strategy(4, 30).regions == 8 and Strategy(1, 30).regions == 30
    with pytest.raises(ValueError, match="a list of strategies"):
        est.Objective(tried=Strategy(1, 30))
    with pytest.raises(ValueError, match="1..32"):
        Strategy(33, 32)
    with pytest.raises(ValueError, match="not inside"):
        est.estimate(LLAMA3, WSE2, Extent(800, 100), KVReserve(64, 1))
    with pytest.raises(ValueError, match="neither a named model"):
        model_by_name("llama9-1t")


def test_streaming_is_bounded_by_the_ingress():
    s8 = streaming(QWEN72, WSE2, WSE2.full_mesh, KVReserve(4096, 8), "float16")
    s4 = streaming(QWEN72, WSE2, WSE2.full_mesh, KVReserve(4096, 4), "float16")
    assert s8.fits and s8.tokens_per_s <= s8.ingress_bound_tokens_per_s
    assert s8.tokens_per_s == pytest.approx(2 * s4.tokens_per_s, rel=0.01)  # 2 lanes, each streams it all
    assert s8.weight_bytes == pytest.approx(QWEN72.params() * 2 - QWEN72.vocab_size * QWEN72.dim * 2, rel=0.01)
    assert s8.knee_requests > s8.max_requests  # K/V room runs out before compute catches up with the stream
    small = streaming(SMOLLM2_135M, WSE2, WSE2.full_mesh, KVReserve(512, 8), "float16", resident_tokens_per_s=1e4)
    assert small.fits and small.tokens_per_s < 1e4 and "resident" in small.text()


def test_the_sweeps_area_model_and_its_best_design():
    assert sw.core_area_um2(48 * 1024) * sw.WSE2_CORES / 1e6 == pytest.approx(sw.WSE2_DIE_MM2)
    assert sw.core_area_um2(96 * 1024) > sw.core_area_um2(48 * 1024)
    grid = sw.Grid((32 * 1024, 64 * 1024), (Extent(650, 862), Extent(820, 1087)), (4.0,), (1.1e9,))
    asked = est.Objective("latency", (Strategy(1, 30),))
    points = sw.sweep(SMOLLM2_135M, WSE2, grid, KVReserve(1024, 4), "float16", asked)
    best = sw.best_point(points)
    assert len(points) == 4 and best is not None and best.within_budget
    assert all(p.tokens_per_s <= best.tokens_per_s for p in points if p.within_budget)
    assert not points[-1].within_budget  # 820x1087 cores of 64 KB exceed one WSE-2 die
    assert "best within the area budget" in sw.table(points, best)
