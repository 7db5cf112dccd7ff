"""A small load run against a live ``waferrt serve`` (the tiny model, on loopback), driven by ``waferrt bench``
itself: Poisson arrivals, none fails, each output is the request decoded alone (the numpy reference), the
server's /metrics counters are the summed usage, and nothing is running or waiting at the end."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from serving import FLAGS, live_server, tiny_gguf

from waferrt.cli import main

pytestmark = pytest.mark.slow
PROMPTS = ["the cat sat on", "to be or not", "a b c d e", "hello world", "once upon a time there",
           "tea for two", "abc abc abc", "one two three four five six"]
N = 24


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus sample's values over its labels (0 when absent)."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _alone(model: str, prompt: str, max_tokens: int) -> str:
    """The text of `prompt` decoded alone, greedy, on the numpy reference."""
    from waferrt.model import Sampler, Tokenizer, load_model
    from waferrt.serving import GenRequest, generate_reference

    config, weights, meta = load_model(model, False)
    tok = Tokenizer(meta)
    out, _ = generate_reference(config, weights, [GenRequest(tuple(tok.encode(prompt)), max_tokens)], Sampler())
    return tok.decode(out[0].tokens, skip_special=True)


def test_a_poisson_load_run_loses_nothing_and_every_output_is_the_request_alone(tmp_path):
    model = tiny_gguf(tmp_path)
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "result.json"
    drawn = tmp_path / "drawn.json"
    with live_server(["--model", model, *FLAGS, "--api-key", "k"], tmp_path) as url:
        rc = main(["bench", "--base-url", url, "--api-key", "k", "--model", model,
                   "--prompts", str(tmp_path / "prompts.txt"), "--num-prompts", str(N), "--request-rate", "8",
                   "--burstiness", "1", "--max-concurrency", "6", "--output-len", "8", "--range-ratio", "0.5",
                   "--seed", "5", "--slo", "ttft:60000,tpot:60000", "--timeout", "120", "--deadline", "300",
                   "--save-result", str(out)])
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        # prompts drawn with the model's tokenizer, the served model named
        model_id = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"]
        assert main(["bench", "--base-url", url, "--api-key", "k", "--model", model, "--num-prompts", "3",
                     "--input-len", "6", "--output-len", "3", "--served-model-name", model_id,
                     "--save-result", str(drawn)]) == 0
    res = json.loads(out.read_text())
    server = [line for line in metrics.splitlines()  # what the server says of its requests, if one failed
              if line.startswith(("vllm:num_requests_", "vllm:request_success_total"))]
    assert rc == 0 and (res["completed"], res["failed"]) == (N, 0), (res["errors"], server)
    assert res["request_goodput"] == pytest.approx(res["request_throughput"])  # every request within the SLOs
    assert json.loads(drawn.read_text())["completed"] == 3
    sent = res["requests"]
    assert [r["index"] for r in sent] == list(range(N))
    assert _metric(metrics, "vllm:prompt_tokens_total") == sum(r["prompt_tokens"] for r in sent)
    assert _metric(metrics, "vllm:generation_tokens_total") == sum(r["output_tokens"] for r in sent)
    assert _metric(metrics, "vllm:request_success_total") == N
    assert _metric(metrics, "vllm:num_requests_running") == 0 and _metric(metrics, "vllm:num_requests_waiting") == 0
    assert res["wall"]["ttft"]["p99_ms"] > 0 and res["modelled"]["ttft"]["mean_ms"] > 0
    for r in sent:  # ignore_eos: every request makes the tokens it asked for, as the reference does
        assert r["output_tokens"] == r["max_tokens"]
        assert r["text"] == _alone(model, PROMPTS[r["index"] % len(PROMPTS)], r["max_tokens"]), r
