"""The prefill on paper (waferrt.estimator.prefill) and `waferrt estimate --prompt-tokens`: its GEMMs are the
closed forms the emulated MeshGEMM is held to, its parts add up, its chunks fit the SRAM the decode leaves,
and the command prints tokens/s, time to first token and an end-to-end pair for the named models."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from waferrt.cli import main
from waferrt.core.cost import total
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2, WSE3
from waferrt.decode.cost import stage_handover
from waferrt.decode.prefill import prefill_layer_cost, prefill_layer_parts, weights_move
from waferrt.model.zoo import MODELS, model_by_name
from waferrt.estimator.estimate import estimate
from waferrt.estimator.prefill import _pipeline_parts, activation_bytes, chunk_parts, decoding, prefill
from waferrt.scheduler.types import KVReserve


def _est(model: str, spec, requests: int = 8):
    config, label = model_by_name(model)
    return replace(estimate(config, spec, spec.full_mesh, KVReserve(min(4096, config.max_seq_len), requests), "float16"),
                   label=label)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_one_chunk_costs_what_the_emulated_prefill_books(dtype):
    config, label = model_by_name("smollm2-135m")
    est = replace(estimate(config, WSE2, WSE2.full_mesh, KVReserve(2048, 8), dtype), label=label)
    region = est.shape.region()
    one = total(c for _, _, c in chunk_parts(est, region, 512, 512))
    weights = weights_move(WSE2, decoding(est), region, dtype).scaled(2)
    assert one + weights == total(c for _, _, c in prefill_layer_parts(WSE2, decoding(est), region, 512))
    if dtype == "float32":  # what prefill_layer books on the emulated wafer (tests/unit/test_prefill_layer.py)
        assert one + weights == prefill_layer_cost(WSE2, decoding(est), region, 512)


@pytest.mark.parametrize("model, spec", [("smollm2-135m", WSE2), ("llama3-8b", WSE2), ("llama3-8b", WSE3)])
def test_the_prefill_adds_up_and_fits_what_the_decode_leaves(model, spec):
    est = _est(model, spec)
    pre = prefill(est, 4096)
    assert pre.ttft_s > pre.seconds > 0
    on_wafer = sum(v for k, v in pre.breakdown_s.items() if k != "host")
    assert on_wafer == pytest.approx(pre.seconds)
    assert pre.tokens_per_s == pytest.approx(4096 / pre.seconds)
    assert pre.core_bytes <= spec.sram_bytes - est.layer_core_bytes
    assert prefill(est, 1024).ttft_s < pre.ttft_s
    one = sum(c.cycles for _, _, c in _pipeline_parts(est, est.shape.region(), 4096, pre.chunks))
    assert pre.seconds * spec.clock_hz >= one  # plus the weights' layout moves
    assert pre.end_to_end(128) == pytest.approx(pre.ttft_s + 127 * est.time_per_token_s)


def test_the_paper_hands_a_chunk_over_as_the_tiles_hand_a_micro_batch_over():
    """One owner of the hand-over: the estimate's is decode.cost.stage_handover into the region beside,
    what the tiles book for a micro-batch of the chunk's items (tests/unit/test_chunked_prefill.py holds
    the tiles' prefill to it)."""
    est = _est("smollm2-135m", WSE2)
    region = est.shape.region()
    for chunks in (1, 4):
        got = [c for name, _, c in _pipeline_parts(est, region, 2048, chunks) if name == "handover"]
        beside = Region(region.x1, region.y0, region.w, region.h)
        want = stage_handover(WSE2, est.config, region, beside, 2048 // chunks)
        assert got == [want] * (chunks + est.strategy.regions - 1) and want.cycles > 0


def test_chunks_only_as_small_as_the_sram_needs_or_the_pipeline_likes():
    est = _est("llama3-8b", WSE2)
    region = est.shape.region()
    pre = prefill(est, 4096)
    assert activation_bytes(est, region, 4096 // pre.chunks, 4096) <= WSE2.sram_bytes - est.layer_core_bytes
    whole_prompt = sum(c.cycles for _, _, c in _pipeline_parts(est, region, 4096, 1))
    chosen = sum(c.cycles for _, _, c in _pipeline_parts(est, region, 4096, pre.chunks))
    assert chosen < whole_prompt  # 8 regions work on successive chunks at once


def test_estimate_prints_the_prefill_and_an_end_to_end_pair(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--prompt-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    for words in ("prefill         4,096 prompt tokens", "tokens/s; time to first token", "prefill cores",
                  "MeshGEMM on 158x158", "end to end      2048 in, 128 out"):
        assert words in out, words
    assert main(["estimate", "--model", "smollm2-135m", "--preset", "wse3", "--pair", "512:64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["prefill"]
    assert doc["prompt_tokens"] == 4096 and doc["ttft_s"] > doc["prefill_s"] > 0
    assert doc["end_to_end"]["in"] == 512 and doc["end_to_end"]["new_tokens_per_s"] > 0


@pytest.mark.parametrize("spec", ["wse2", "wse3"])
def test_every_named_model_gets_a_prefill_or_says_it_does_not_fit(spec, capsys):
    for model in sorted(MODELS):
        code = main(["estimate", "--model", model, "--preset", spec, "--strategy", "tensor"])
        out = capsys.readouterr().out
        assert ("time to first token" in out) if code == 0 else ("DOES NOT FIT" in out and code == 1), model


@pytest.mark.parametrize("argv, words", [(["--prompt-tokens", "0"], "0 is less than 1"),
                                         (["--pair", "12"], "is not IN:OUT")])
def test_unreadable_prompt_arguments_say_what_to_write(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(["estimate", *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [(["--prompt-tokens", "5000"], "give --kv-tokens 5000"),
                                         (["--pair", "4000:200"], "give --kv-tokens 4200")])
def test_prompts_beyond_the_kv_reserve_say_what_to_write(argv, words, capsys):
    assert main(["estimate", *argv]) == 2
    assert words in capsys.readouterr().err
