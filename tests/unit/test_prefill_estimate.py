"""The prefill on paper (waferrt.estimator.prefill) and `waferrt estimate --prompt-tokens`: its GEMMs are the
closed forms the emulated MeshGEMM is held to, its parts add up, its chunks fit the SRAM the decode leaves,
and the command prints tokens/s, time to first token and an end-to-end pair for the named models."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from waferrt.cli import main
from waferrt.core.cost import total
from waferrt.core.mesh import Extent, Region
from waferrt.core.spec import WSE2, WSE3
from waferrt.decode.kvcache import PromptChunk
from waferrt.decode.prefill import prefill_layer_cost, prefill_layer_parts, prefill_moves, prefill_work_parts
from waferrt.estimator.estimate import estimate
from waferrt.estimator.prefill import (
    PUBLISHED,
    activation_bytes,
    decoding,
    prefill,
    published_lines,
    region_exchange,
    weight_block_bytes,
)
from waferrt.model.zoo import MODELS, model_by_name
from waferrt.scheduler.types import KVReserve


def _est(model: str, spec, requests: int = 8):
    config, label = model_by_name(model)
    kv = KVReserve(min(4096, config.max_seq_len), requests)
    return replace(estimate(config, spec, spec.full_mesh, kv, "float16"), label=label)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_layer_on_the_grid_costs_what_the_emulated_prefill_books_for_it(dtype):
    """One owner for tiles and paper: the estimate's layer on its grid is prefill_work_parts of that grid, what
    the emulated prefill_layer books on a square region but the moves inside its region (decode.prefill)."""
    config, label = model_by_name("smollm2-135m")
    est = replace(estimate(config, WSE2, WSE2.full_mesh, KVReserve(512, 1), dtype), label=label)
    pre, grid = prefill(est, 256, 32), Region(0, 0, 32, 32)
    work = total(c for _, _, c in prefill_work_parts(WSE2, decoding(est), grid, 256))
    assert pre.chunks == 1 and pre.side == 32
    on_grid = sum(v for k, v in pre.breakdown_s.items() if k not in ("layout", "host"))
    assert on_grid == pytest.approx(config.n_layers * work.seconds(WSE2))
    moves = total(c for _, _, c in prefill_moves(WSE2, decoding(est), grid, PromptChunk(0, 256), dtype))
    assert work + moves == total(c for _, _, c in prefill_layer_parts(WSE2, decoding(est), grid, 256))
    if dtype == "float32":  # what prefill_layer books on the emulated wafer (tests/unit/test_prefill_layer.py)
        assert work + moves == prefill_layer_cost(WSE2, decoding(est), grid, 256)


def test_the_exchange_between_a_region_and_the_grid_by_hand():
    """6,400 bytes over an 8x8 grid, 16 of its cores inside a 4x4 region at the corner of a 10x10 mesh: 4,800
    bytes cross the region's 8 inner boundary links, 600 each, over 16 hops: 16 + 30 + 600 / 4 = 196 cycles."""
    c = region_exchange(WSE2, Region(0, 0, 4, 4), Extent(10, 10), Region(0, 0, 8, 8), 6400)
    assert (c.link_bytes, c.messages, c.hops, c.cycles) == (4800, 8, 16, 196)
    assert region_exchange(WSE2, Region(0, 0, 8, 8), Extent(10, 10), Region(0, 0, 8, 8), 6400).cycles == 0


@pytest.mark.parametrize("model, spec", [("smollm2-135m", WSE2), ("llama3-8b", WSE2), ("llama3-8b", WSE3)])
def test_the_prefill_adds_up_and_fits_what_the_decode_leaves(model, spec):
    est = _est(model, spec)
    pre = prefill(est, 4096)
    assert pre.ttft_s > pre.seconds > 0 and pre.side == min(*spec.full_mesh, est.config.dim)
    on_wafer = sum(v for k, v in pre.breakdown_s.items() if k != "host")
    assert on_wafer == pytest.approx(pre.seconds)
    assert pre.tokens_per_s == pytest.approx(4096 / pre.seconds)
    assert pre.core_bytes <= spec.sram_bytes - est.layer_core_bytes
    assert prefill(est, 1024).ttft_s < pre.ttft_s
    assert pre.end_to_end(128) == pytest.approx(pre.ttft_s + 127 * est.time_per_token_s)


def test_the_prefill_takes_the_grid_it_is_given_and_chunks_only_as_the_sram_needs():
    """WaferLLM gives its prefill the wafer: the grid is the mesh's largest square (--mesh changes it), or
    the side asked for; a chunk is halved only while its activations and the weight blocks do not fit."""
    est = _est("llama3-8b", WSE2, requests=1)
    whole, smaller = prefill(est, 4096), prefill(est, 4096, 600)
    assert (whole.side, whole.cores, smaller.side) == (750, 562_500, 600)
    free = WSE2.sram_bytes - est.layer_core_bytes
    for pre in (whole, smaller):
        chunk = 4096 // pre.chunks
        assert weight_block_bytes(est.config, pre.side, "float16") + \
            activation_bytes(est.config, pre.side, chunk, 4096, "float16") <= free
        if pre.chunks > 1:
            assert weight_block_bytes(est.config, pre.side, "float16") + \
                activation_bytes(est.config, pre.side, 2 * chunk, 4096, "float16") > free
    assert smaller.chunks > whole.chunks and smaller.tokens_per_s < whole.tokens_per_s
    mesh = replace(estimate(est.config, WSE2, Extent(720, 720), KVReserve(4096, 1), "float16"), label="Llama3-8B")
    assert prefill(mesh, 4096).side == 720
    with pytest.raises(ValueError, match="give a larger grid"):
        prefill(est, 4096, 480)  # the decode leaves 1.5 KB a core; a layer's gate/up blocks take 2 KB of 480^2


def test_llama3_8bs_prefill_is_set_beside_waferllms_measured_range():
    """WaferLLM measured 20,321-27,687 tokens/s (4096 tokens, 480^2-720^2 cores). The model lands in it where
    the SRAM the decode leaves forces 8 chunks (a 600^2 grid); on 720^2-750^2 it is ~1.8-1.9x faster, its time
    the MeshGEMMs' and the attention's (docs/ESTIMATES.md: why)."""
    est = _est("llama3-8b", WSE2, requests=1)
    lo, hi = PUBLISHED
    assert lo <= prefill(est, 4096, 600).tokens_per_s <= hi
    for side in (720, 750):
        pre = prefill(est, 4096, side)
        assert 1.5 * hi < pre.tokens_per_s < 2.5 * hi
        line = published_lines(est.config, pre)[0]
        assert "above it" in line and "attention" in line
    assert published_lines(_est("smollm2-135m", WSE2).config, pre) == []


def test_estimate_prints_the_prefill_and_an_end_to_end_pair(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--prompt-tokens", "4096"]) == 0
    out = capsys.readouterr().out
    for words in ("prefill         4,096 prompt tokens", "tokens/s; time to first token", "prefill cores",
                  "MeshGEMMs on a 750x750 grid", "vs WaferLLM", "end to end      2048 in, 128 out"):
        assert words in out, words
    assert main(["estimate", "--model", "llama3-8b", "--prefill-grid", "480"]) == 2
    assert "give a larger grid" in capsys.readouterr().err
    assert main(["estimate", "--model", "smollm2-135m", "--preset", "wse3", "--pair", "512:64", "--json",
                 "--prefill-grid", "500"]) == 0
    doc = json.loads(capsys.readouterr().out)["prefill"]
    assert doc["prompt_tokens"] == 4096 and doc["ttft_s"] > doc["prefill_s"] > 0 and doc["gemm_grid"] == [500, 500]
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
