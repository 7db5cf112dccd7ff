"""`waferrt serve` live on loopback (one server for the module, its own process and Ray), driven by the
official `openai` client and raw httpx: the OpenAI shapes, SSE framing, 30+ bad requests answered with
OpenAI-shaped errors, a burst beyond the queue refused with Retry-After, clients that go away, and
/metrics equal to the usage the responses reported. Outputs equal `waferrt generate`'s for the same prompt
(its --reference, which the wafer equals: tests/runtime/test_cli_generate.py)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
import time

import httpx
import pytest
from serving import FLAGS, live_server, reference, tiny_gguf

openai = pytest.importorskip("openai")

PROMPTS = ["hello world", "to be or", "abc", "the sky is"]
MAX_TOKENS = 8
LONG_TOKENS = 40  # requests that are still running while the others arrive
QUEUED = 4  # --max-queued; 4 running (--requests 4)
T = httpx.Timeout(120.0)
USED = {"prompt": 0, "completion": 0, "requests": 0}  # what the successful responses reported, for /metrics


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    model = tiny_gguf(folder)
    with live_server(["--model", model, *FLAGS, "--max-queued", str(QUEUED)], folder) as url:
        yield url, model


@pytest.fixture(scope="module")
def alone(served):
    """Each prompt's greedy text as `waferrt generate` gives it."""
    return dict(zip(PROMPTS, reference(served[1], PROMPTS, MAX_TOKENS)))


@pytest.fixture(scope="module")
def alone_long(served):
    """The same, LONG_TOKENS tokens each."""
    return dict(zip(PROMPTS, reference(served[1], PROMPTS, LONG_TOKENS)))


def _count(usage) -> None:
    USED["prompt"] += usage["prompt_tokens"]
    USED["completion"] += usage["completion_tokens"]
    USED["requests"] += 1


def _client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=120.0, max_retries=0)


def test_openai_client_lists_the_model_and_completes_as_generate_does(served, alone):
    url, _ = served
    client = _client(url)
    assert [m.id for m in client.models.list()] == ["tiny"]
    got = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0)
    assert got.choices[0].text == alone[PROMPTS[0]]
    assert got.usage.prompt_tokens == len(PROMPTS[0]) and got.usage.completion_tokens == MAX_TOKENS
    assert got.choices[0].finish_reason == "length"
    m = got.model_extra["metrics"]
    assert m["ttft_s"] > 0 and m["e2e_s"] >= m["ttft_s"] and m["modelled"]["ttft_s"] > 0
    _count(got.usage.model_dump())


def test_a_streamed_chat_reports_the_usage_it_streamed(served):
    url, _ = served
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    chunks = list(_client(url).chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                                       stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    counted = httpx.post(f"{url}/tokenize", json={"model": "tiny", "messages": messages}, timeout=T).json()
    assert chunks[-1].usage.prompt_tokens == counted["count"] == len(counted["tokens"])
    _count(chunks[-1].usage.model_dump())


def test_sse_framing_is_data_lines_then_done(served):
    url, _ = served
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=T) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    parsed = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 4
    assert all(p["object"] == "text_completion" for p in parsed)
    _count(parsed[-1]["usage"])


LONG = "x" * 200  # 200 byte tokens: more than a request's 160 K/V positions
BAD = [  # (method, path, body (dict, or raw bytes), status, error type, param)
    ("POST", "/v1/completions", {"model": "nope", "prompt": "hi"}, 404, "not_found_error", "model"),
    ("POST", "/v1/completions", {"model": 3, "prompt": "hi"}, 400, "invalid_request_error", "model"),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "invalid_request_error", "max_tokens"),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": "8"}, 400, "invalid_request_error", "max_tokens"),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1.5}, 400, "invalid_request_error", "max_tokens"),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 159}, 400, "invalid_request_error", "max_tokens"),
    ("POST", "/v1/completions", {"prompt": LONG}, 400, "invalid_request_error", "prompt"),
    ("POST", "/v1/completions", {"prompt": ""}, 400, "invalid_request_error", "prompt"),
    ("POST", "/v1/completions", {"prompt": None}, 400, "invalid_request_error", "prompt"),
    ("POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, "invalid_request_error", "prompt"),
    ("POST", "/v1/completions", {"prompt": [1, 999]}, 400, "invalid_request_error", "prompt"),
    ("POST", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, "invalid_request_error", "temperature"),
    ("POST", "/v1/completions", {"prompt": "hi", "temperature": 3}, 400, "invalid_request_error", "temperature"),
    ("POST", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ("POST", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "invalid_request_error", "top_p"),
    ("POST", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "invalid_request_error", "top_p"),
    ("POST", "/v1/completions", {"prompt": "hi", "seed": -1}, 400, "invalid_request_error", "seed"),
    ("POST", "/v1/completions", {"prompt": "hi", "seed": "x"}, 400, "invalid_request_error", "seed"),
    ("POST", "/v1/completions", {"prompt": "hi", "n": 2}, 400, "invalid_request_error", "n"),
    ("POST", "/v1/completions", {"prompt": "hi", "stop": 5}, 400, "invalid_request_error", "stop"),
    ("POST", "/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_request_error",
     "stop"),
    ("POST", "/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "invalid_request_error", "stop"),
    ("POST", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "invalid_request_error", "stream"),
    ("POST", "/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400,
     "invalid_request_error", "stream_options"),
    ("POST", "/v1/completions", {"prompt": "hi", "stream": True, "stream_options": 1}, 400, "invalid_request_error",
     "stream_options"),
    ("POST", "/v1/completions", {"prompt": "hi", "ignore_eos": "no"}, 400, "invalid_request_error", "ignore_eos"),
    ("POST", "/v1/completions", {"prompt": "hi", "logprobs": 2}, 400, "invalid_request_error", "logprobs"),
    ("POST", "/v1/completions", {"prompt": "hi", "echo": True}, 400, "invalid_request_error", "echo"),
    ("POST", "/v1/completions", {"prompt": "hi", "presence_penalty": 0.5}, 400, "invalid_request_error",
     "presence_penalty"),
    ("POST", "/v1/completions", b"{not json", 400, "invalid_request_error", None),
    ("POST", "/v1/completions", b"[1, 2]", 400, "invalid_request_error", None),
    ("POST", "/v1/completions", b"\xff\xfe", 400, "invalid_request_error", None),
    ("POST", "/v1/completions", b'{"prompt": "' + b"a" * (1 << 20) + b'"}', 400, "invalid_request_error", None),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "invalid_request_error", "messages"),
    ("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "invalid_request_error", "messages"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400,
     "invalid_request_error", "messages"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "invalid_request_error",
     "messages"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3},
     400, "invalid_request_error", "max_completion_tokens"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400,
     "invalid_request_error", "messages"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{}]}, 400,
     "invalid_request_error", "tools"),
    ("POST", "/detokenize", {"tokens": [1, -1]}, 400, "invalid_request_error", "tokens"),
    ("POST", "/detokenize", {"tokens": "abc"}, 400, "invalid_request_error", "tokens"),
    ("POST", "/tokenize", {"prompt": 7}, 400, "invalid_request_error", "prompt"),
    ("GET", "/v1/nothing", None, 404, "not_found_error", None),
    ("GET", "/v1/completions", None, 405, "invalid_request_error", None),
    ("POST", "/v1/models", {}, 405, "invalid_request_error", None),
    ("POST", "/v1/wafer/faults", {"kind": "straggler"}, 403, "permission_error", None),
]


@pytest.mark.parametrize("method,path,body,status,kind,param", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_a_bad_request_gets_an_openai_shaped_error(served, method, path, body, status, kind, param):
    url, _ = served
    content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    r = httpx.request(method, f"{url}{path}", content=content, headers={"content-type": "application/json"},
                      timeout=T)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert err["type"] == kind and err["param"] == param and "Traceback" not in err["message"]


def test_a_burst_beyond_the_queue_is_refused_with_retry_after_and_nothing_hangs(served, alone_long):
    url, _ = served
    sent = 4 * (4 + QUEUED)
    body = {"model": "tiny", "prompt": PROMPTS[2], "max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True}
    together = threading.Barrier(sent)

    def post(_):
        together.wait(60)  # all at once: the first eight are still running when the others arrive
        return httpx.post(f"{url}/v1/completions", json=body, timeout=T)

    with cf.ThreadPoolExecutor(sent) as pool:
        got = list(pool.map(post, range(sent)))
    ok = [r for r in got if r.status_code == 200]
    refused = [r for r in got if r.status_code == 429]
    assert len(ok) + len(refused) == sent and len(ok) >= 4 + QUEUED and refused, \
        [r.text[:300] for r in got if r.status_code not in (200, 429)][:3]
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "rate_limit_error" for r in refused)
    assert all(r.json()["choices"][0]["text"] == alone_long[PROMPTS[2]] for r in ok)
    for r in ok:
        _count(r.json()["usage"])


def test_metrics_count_what_the_responses_reported_and_nothing_is_left_running(served):
    url, _ = served
    text = httpx.get(f"{url}/metrics", timeout=T).text

    def value(name: str, labels: str = "") -> float:
        return float(re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M).group(1))

    assert value("vllm:num_requests_running") == 0 and value("vllm:num_requests_waiting") == 0
    assert value("vllm:prompt_tokens_total") == USED["prompt"]
    assert value("vllm:generation_tokens_total") == USED["completion"]
    assert value("vllm:request_success_total", '{finished_reason="length"}') == USED["requests"]
    assert value("vllm:time_to_first_token_seconds_count") == USED["requests"]
    assert value("vllm:e2e_request_latency_seconds_count") == USED["requests"]
    assert value("waferrt:faults_injected_total") == 0
    assert httpx.get(f"{url}/health", timeout=T).text == "ok"


def test_clients_that_go_away_free_their_slots_and_the_rest_finish_right(served, alone_long):
    url, _ = served
    body = {"model": "tiny", "max_tokens": LONG_TOKENS, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}

    def one(i: int):
        prompt = PROMPTS[i % len(PROMPTS)]
        with httpx.stream("POST", f"{url}/v1/completions", json=body | {"prompt": prompt}, timeout=T) as r:
            text, usage = "", None
            for line in r.iter_lines():
                if i % 2 and line.startswith("data: {"):
                    return None  # goes away after its first chunk
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text += "".join(c["text"] for c in chunk["choices"])
                    usage = chunk.get("usage", usage)
        return prompt, text, usage

    with cf.ThreadPoolExecutor(8) as pool:
        done = [d for d in pool.map(one, range(8)) if d is not None]
    assert len(done) == 4 and all(text == alone_long[p] and usage["completion_tokens"] == LONG_TOKENS
                                  for p, text, usage in done)
    end = time.monotonic() + 30
    while (state := httpx.get(f"{url}/v1/wafer/state", timeout=T).json())["requests"] and time.monotonic() < end:
        time.sleep(0.2)  # the four that went away: cancelled within a few decode steps
    assert state["requests"] == [] and state["counts"] == {"running": 0, "waiting": 0}
    text = httpx.get(f"{url}/metrics", timeout=T).text
    assert 'vllm:request_success_total{finished_reason="abort"} 4.0' in text
    assert state["mesh"]["width"] == 16 and len(state["mesh"]["sram"]) == 16


def test_the_stage_runs_are_kept_for_the_live_heatmap_only_while_it_is_watched(served):
    """Nobody watching the live state (Runner.WATCHED_S), a request's stage runs are not kept for it (nor read
    from the busy tiles every 0.5 s): the next look has no link heatmap; a request that runs while it is
    watched shows in the next."""
    from waferrt.server.runner import WATCHED_S

    url, _ = served
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
    time.sleep(WATCHED_S + 0.5)  # the earlier tests' looks have lapsed
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=T).status_code == 200
    unwatched = httpx.get(f"{url}/v1/wafer/state", timeout=T).json()["mesh"]["links"]
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=T).status_code == 200
    watched = httpx.get(f"{url}/v1/wafer/state", timeout=T).json()["mesh"]["links"]
    assert unwatched is None and watched is not None
