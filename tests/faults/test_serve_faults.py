"""`waferrt serve --chaos SEED:K` under load: seeded faults strike while requests are in flight (prompts and
decode), every request completes with 200 and the text it has decoded alone -- greedy, and sampled with a seed
(temperature, top_p: the request's RNG is its seed's, one draw per token, so a request resumed after a fault
draws on where it was) -- /health answers 503 "recovering" while a recovery runs, and /metrics counts the faults
found and recovered from. The server wants an API key (--api-key) and arms faults over HTTP (--http-faults):
without the key a request is refused with 401, with it a fault armed by POST /v1/wafer/faults shows in the
fault log. One server (its own process and Ray) on the small GGUF (tests/serving.py)."""

from __future__ import annotations

import concurrent.futures as cf
import re
import threading

import httpx
import pytest
from serving import FLAGS, live_server, reference, tiny_gguf

PROMPTS = ["hello world", "to be or", "abc", "the sky is", "once upon a time", "xyz"]
TOKENS = 24
FAULTS = 3
T = httpx.Timeout(300.0)
KEY = {"Authorization": "Bearer k3y"}
SAMPLED = {"temperature": 0.8, "top_p": 0.9}  # with "seed": the prompt's place in PROMPTS


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_chaos")
    model = tiny_gguf(folder)
    with live_server(["--model", model, *FLAGS, "--chaos", f"5:{FAULTS}", "--api-key", "k3y",
                                  "--http-faults"], folder) as url:
        yield url, model


def _sampled_alone(model: str, prompt: str, seed: int) -> str:
    """`prompt` decoded alone on the numpy reference, sampled as SAMPLED with `seed` (request 0's RNG)."""
    from waferrt.model import Sampler, Tokenizer, load_model
    from waferrt.serving import GenRequest, generate_reference

    config, weights, meta = load_model(model, False)
    tok, sampler = Tokenizer(meta), Sampler(temperature=0.8, top_p=0.9, seed=seed)
    out, _ = generate_reference(config, weights, [GenRequest(tuple(tok.encode(prompt)), TOKENS)], sampler)
    return tok.decode(out[0].tokens, skip_special=True)


def _watch_health(url: str, done: threading.Event, seen: set) -> None:
    """Ask /health every 20 ms until `done`, keeping every (status, text) answered."""
    with httpx.Client(timeout=T) as client:
        while not done.wait(0.02):
            r = client.get(f"{url}/health")
            seen.add((r.status_code, r.text))


def test_seeded_faults_under_load_lose_nothing_and_change_no_token(served):
    url, model = served
    body = {"model": "tiny", "max_tokens": TOKENS, "ignore_eos": True}
    work = [(p, {"temperature": 0}) for p in PROMPTS * 2] + [(p, SAMPLED | {"seed": i}) for i, p in enumerate(PROMPTS)]
    done, seen = threading.Event(), set()
    watcher = threading.Thread(target=_watch_health, args=(url, done, seen), daemon=True)
    watcher.start()
    with cf.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda w: httpx.post(f"{url}/v1/completions", json=body | w[1] | {"prompt": w[0]},
                                                 headers=KEY, timeout=T),
                            work))
    done.set()
    watcher.join(60)
    assert [r.status_code for r in got] == [200] * len(work), [r.text[:300] for r in got if r.status_code != 200]
    alone = dict(zip(PROMPTS, reference(model, PROMPTS, TOKENS)))
    sampled = [_sampled_alone(model, p, i) for i, p in enumerate(PROMPTS)]
    assert [r.json()["choices"][0]["text"] for r in got] == [alone[p] for p in PROMPTS * 2] + sampled
    assert sampled != list(alone.values())  # sampling made other texts than greedy
    assert (503, "recovering") in seen and (200, "ok") in seen, seen
    assert all(r.json()["usage"]["completion_tokens"] == TOKENS for r in got)
    text = httpx.get(f"{url}/metrics", timeout=T).text

    def value(name: str) -> float:
        return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))

    assert value("waferrt:faults_injected_total") == FAULTS
    assert value("waferrt:faults_recovered_total") >= 1
    assert value("waferrt:faults_recovered_total") == value("waferrt:faults_detected_total")
    faults = httpx.get(f"{url}/v1/wafer/state", headers=KEY, timeout=T).json()["faults"]
    assert len(faults) == FAULTS and all(f["injected_at"] for f in faults)
    assert httpx.get(f"{url}/health", timeout=T).text == "ok"


def test_without_the_key_a_request_is_refused_and_with_it_a_fault_is_armed_over_http(served):
    url, _ = served
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k3y"}):
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=T)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(f"{url}/v1/wafer/faults", json={"kind": "straggler"}, timeout=T).status_code == 401
    assert httpx.get(f"{url}/health", timeout=T).status_code == 200  # open, as vLLM's
    slow = {"kind": "straggler", "tile": [0, 0], "delay": 0.01}
    r = httpx.post(f"{url}/v1/wafer/faults", json=slow, headers=KEY, timeout=T)
    assert r.status_code == 200 and r.json()["index"] == FAULTS
    state = httpx.get(f"{url}/v1/wafer/state", headers=KEY, timeout=T).json()
    assert [f["kind"] for f in state["faults"]][-1] == "straggler" and state["faults"][-1]["injected_at"]
    bad = httpx.post(f"{url}/v1/wafer/faults", json={"kind": "meteor"}, headers=KEY, timeout=T)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/v1/completions", json=body | {"temperature": 0}, headers=KEY, timeout=T)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
