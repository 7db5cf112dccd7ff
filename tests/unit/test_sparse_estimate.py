"""STAR's sparse attention on paper (estimator.sparse_estimate, `waferrt estimate --attention sparse:K`): the
figures are decode.cost's attention_parts on the estimate's layer region, and the crossover is read right."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.cost import attention_parts
from waferrt.decode.decoding import Decoding
from waferrt.estimator.estimate import Objective, estimate
from waferrt.estimator.sparse_estimate import ContextRow, SparseEstimate, sparse_estimate
from waferrt.model import AttentionMode
from waferrt.model.zoo import model_by_name
from waferrt.scheduler import KVReserve


@pytest.fixture(scope="module")
def smollm2_8k():
    config, _ = model_by_name("smollm2-135m")
    return estimate(config, WSE2, WSE2.full_mesh, KVReserve(8192, 1), "float16", Objective("latency"))


def test_the_rows_are_attention_parts_on_the_estimates_region(smollm2_8k) -> None:
    est, mode = smollm2_8k, AttentionMode(keep=64)
    sp = sparse_estimate(est, mode)
    dec = Decoding(est.config, est.dtype, head_groups=est.shape.head_groups)
    region = est.shape.region()
    assert sp.longest_context == est.kv_tokens_per_request == 8192
    assert [r.context for r in sp.rows][:6] == [256, 512, 1024, 2048, 4096, 8192]
    for r in sp.rows:
        assert r.dense_cycles == sum(c.cycles for c in attention_parts(WSE2, dec, region, r.context).values())
        sparse = attention_parts(WSE2, replace(dec, attention=mode), region, r.context)
        assert r.sparse_cycles == sum(c.cycles for c in sparse.values())
        assert r.predict_cycles == sparse["predict"].cycles + sparse["predict.reduce"].cycles
    at = next(r for r in sp.rows if r.context == 8192)
    swap = est.config.n_layers * (at.sparse_cycles - at.dense_cycles) / WSE2.clock_hz
    assert sp.sparse_token_s == pytest.approx(est.time_per_token_s + swap, rel=1e-12)


def test_sparse_pays_on_a_narrow_region_at_long_contexts() -> None:
    """On 32 columns of 32 rows (no head groups) 8,192 positions are 256 a core: sparse:32 (up to 32 kept keys on
    the busiest core) is cheaper there, not at 4,096 (128 a core)."""
    config, _ = model_by_name("smollm2-135m")
    dec, region = Decoding(config), Region(0, 0, 32, 32)
    total = {n: (sum(c.cycles for c in attention_parts(WSE2, dec, region, n).values()),
                 sum(c.cycles for c in attention_parts(WSE2, replace(dec, attention=AttentionMode(keep=32)), region,
                                                       n).values())) for n in (4096, 8192)}
    assert total[4096][1] > total[4096][0] and total[8192][1] < total[8192][0]


def test_pays_from_is_the_start_of_the_last_run_of_cheaper_contexts() -> None:
    def rows(*cheaper: bool) -> tuple[ContextRow, ...]:
        return tuple(ContextRow(256 << i, 10.0, 5.0 if c else 20.0, 1.0, 1.0) for i, c in enumerate(cheaper))

    def pays(*cheaper: bool) -> int | None:
        return SparseEstimate("m", AttentionMode(keep=8), rows(*cheaper), 4096, 4096, 1.0, 1.0).pays_from

    assert pays(False, False, True, True) == 1024
    assert pays(True, False, True) == 1024
    assert pays(True, True) == 256
    assert pays(True, False) is None
    with pytest.raises(ValueError, match="sparse attention mode"):
        SparseEstimate("m", AttentionMode(), rows(True), 4096, 4096, 1.0, 1.0)


def test_the_cli_prints_and_jsons_the_sparse_figures() -> None:
    argv = [sys.executable, "-m", "waferrt.cli", "estimate", "--model", "smollm2-135m", "--attention", "sparse:64",
            "--kv-tokens", "8192", "--requests", "1"]
    text = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "attention       sparse:64: one layer's attention per token" in text.stdout
    assert "the longest context that fits: 8,192 positions a request dense, 8,192 sparse" in text.stdout
    got = json.loads(subprocess.run(argv + ["--json"], capture_output=True, text=True, timeout=300).stdout)["sparse"]
    assert got["mode"] == "sparse:64" and got["longest_context"] == got["dense_longest_context"] == 8192
    assert got["contexts"][0]["context"] == 256 and got["sparse_token_s"] > 0


def test_why_sparse_never_pays_on_the_latency_plan() -> None:
    """Llama3-8B's latency-plan layer region (164x512 cores in 8 head groups, float16) at 1,048,576 positions,
    sparse:64: the add-only prediction and its reduce cost exactly what dense's Q.K^T and its reduce do (the same
    flops at the same 16-bit rate, the same 4-byte partial sums reduced over the rows), so sparse saves at most
    dense's softmax and P.V; the top-K's selection alone costs more: cdiv(1,048,576, 164) = 6,394 positions a
    core x 4 query heads x ceil(log2 65) = 7 comparisons = 179,032 at WSE-2's 2 float32 flops a cycle = 89,516."""
    config, _ = model_by_name("llama3-8b")
    dec, region, n = Decoding(config, "float16", head_groups=8), Region(0, 0, 164, 512), 1 << 20
    dense = attention_parts(WSE2, dec, region, n)
    sparse = attention_parts(WSE2, replace(dec, attention=AttentionMode(keep=64)), region, n)
    assert sparse["predict"] == dense["scores"] and sparse["predict.reduce"] == dense["scores.reduce"]
    assert sparse["topk.select"].cycles == 6394 * 4 * 7 / 2 == 89516
    saved = sum(c.cycles for name, c in dense.items() if not name.startswith("scores"))
    assert sparse["topk.select"].cycles > saved
    assert sum(c.cycles for c in sparse.values()) > sum(c.cycles for c in dense.values())


def test_a_sparse_estimate_that_never_pays_says_why() -> None:
    """The last row's prediction against dense's attention: 80 of 100 cycles, 20 left to win, a top-K of 30."""
    row = ContextRow(4096, 100.0, 150.0, 80.0, 30.0)
    lines = SparseEstimate("m", AttentionMode(keep=8), (row,), 4096, 4096, 1.0, 1.0).lines()
    assert "sparse pays at no context up to 4,096" in lines[0]
    assert ("  why: sparse costs at least its prediction and top-K; at 4,096 the prediction and its reduce alone are "
            "80% of dense's attention, leaving 20 cycles to win, and the top-K costs 30") in lines[-2]


def test_the_benchmark_prints_where_sparse_pays_and_the_synthetic_accuracy() -> None:
    """benchmarks/sparse_attention.py --where-pays: the table on both latency plans, Llama3-8B sparse:64 at 1M
    positions as docs/decode.md shows it (0.73x, the prediction's reduce the largest term); --synthetic, small:
    its one-layer model's accuracy row (its cache fill checked against the reference's prefill as it runs)."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_attention.py"
    pays = subprocess.run([sys.executable, str(script), "--where-pays", "--keeps", "64"], capture_output=True,
                          text=True, timeout=600)
    assert pays.returncode == 0, pays.stderr
    assert "smollm2-135m: 30 layers" in pays.stdout and "llama3-8b: 32 layers" in pays.stdout
    assert ("1,048,576  sparse:64 |   141,010   33,724   174,734 |   141,010   89,516  4,446   3,824   238,796 |  "
            "0.73 |") in pays.stdout and "predict.reduce 54%" in pays.stdout
    synth = subprocess.run([sys.executable, str(script), "--synthetic", "--contexts", "256", "--keeps", "32",
                            "--steps", "1"], capture_output=True, text=True, timeout=600)
    assert synth.returncode == 0, synth.stderr
    assert "synthetic one-layer Llama" in synth.stdout and "    256    sparse:32" in synth.stdout
