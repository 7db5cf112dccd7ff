"""`waferrt estimate` and `waferrt sweep` as a user runs them: subprocesses, exit codes, text, JSON, PNG, help."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _waferrt(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waferrt.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_estimate_llama3_8b_on_wse2_prints_a_rate_and_its_breakdown():
    r = _waferrt("estimate", "--preset", "wse2", "--model", "llama3-8b")
    assert r.returncode == 0, r.stderr
    for words in ("Llama3-8B: 32 layers", "untied head", "one request", "ms per token", "tokens/s", "breakdown",
                  "GEMV", "allreduce", "attention and K/V", "hand-over", "host I/O", "K/V capacity", "SRAM", "why"):
        assert words in r.stdout, words


def test_estimate_json_has_the_promised_fields():
    r = _waferrt("estimate", "--model", "smollm2-135m", "--strategy", "layer", "--requests", "4", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for key in ("tokens_per_s", "time_per_token_s", "cores_used", "sram_used_bytes", "kv_capacity_tokens",
                "breakdown_s"):
        assert key in doc
    assert doc["strategy"] == "layer" and doc["layers_per_region"] == 1 and doc["tokens_per_s"] > 0
    assert doc["time_per_token_s"] == pytest.approx(sum(doc["breakdown_s"].values()))


def test_estimate_that_does_not_fit_exits_1_and_says_what_would():
    r = _waferrt("estimate", "--model", "qwen2-72b")
    assert r.returncode == 1
    assert "DOES NOT FIT" in r.stdout and "wafers" in r.stdout and "--streaming" in r.stdout
    r = _waferrt("estimate", "--model", "qwen2-72b", "--streaming", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert not doc["fits"] and doc["streaming"]["fits"]
    assert doc["streaming"]["tokens_per_s"] <= doc["streaming"]["ingress_bound_tokens_per_s"]


@pytest.mark.parametrize("argv,words", [
    (["--strategy", "mixed"], "'mixed' is not a strategy: write layer, tensor, grouped or grouped:N"),
    (["--model", "smollm2-135m", "--strategy", "grouped:31"], "grouped:N with N from 1 to 30"),
    (["--model", "no-such-model"], "neither a named model"),
    (["--mesh", "900x100"], "not inside the wse2 wafer"),
])
def test_estimate_argument_errors_exit_2_and_teach(argv, words):
    r = _waferrt("estimate", *argv)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_help_teaches_with_examples():
    for command in ("estimate", "sweep"):
        r = _waferrt(command, "--help")
        assert r.returncode == 0 and "examples:" in r.stdout and f"waferrt {command} --model" in r.stdout
    top = _waferrt("--help")
    assert "waferrt estimate" in top.stdout and "waferrt sweep" in top.stdout


def test_sweep_prints_its_table_and_draws_its_png(tmp_path):
    png = tmp_path / "s.png"
    r = _waferrt("sweep", "--model", "smollm2-135m", "--strategy", "layer", "--sram", "4,48", "--mesh",
                 "300x300,750x994", "--png", str(png), "--kv-tokens", "1024")
    assert r.returncode == 0, r.stderr
    assert "best within the area budget" in r.stdout and "SRAM capacity" in r.stdout  # 4 KB does not hold it
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = _waferrt("sweep", "--model", "smollm2-135m", "--sram", "48", "--mesh", "300x300", "--json", "--png",
                 str(png))
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["best"]["mesh"] == "300x300" and len(doc["designs"]) == 1
    assert _waferrt("sweep", "--link", "0,4").returncode == 2


def test_every_named_model_is_answered_with_streaming(capsys):
    """`estimate --streaming` answers every named model (in one process, as the user's command runs it).
    Mixtral's took 182 s when the MoE's all-to-all routed each of a micro-batch's tokens one by one and the
    floor plans re-laid every expert block (decode.linkload.AllToAll.loads, decode.moe_layout._most)."""
    from waferrt.cli import main
    from waferrt.model.zoo import MODELS

    for name in MODELS:
        code = main(["estimate", "--model", name, "--streaming", "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code in (0, 1), name
        assert doc["fits"] or doc["streaming"]["fits"], name
        assert (doc["tokens_per_s"] if doc["fits"] else doc["streaming"]["tokens_per_s"]) > 0, name
