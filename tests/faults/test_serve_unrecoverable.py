"""`waferrt serve --chaos SEED:1 --policy fail-fast`: the first fault is one the server does not recover from.
Every stream open then ends with an in-band error chunk and `data: [DONE]` (never a hang, never a dropped
connection), a request waiting whole gets 503, new requests get 503 with Retry-After, /health says down.
One server (its own process and Ray) on the small GGUF (tests/serving.py)."""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import pytest
from serving import FLAGS, live_server, tiny_gguf

T = httpx.Timeout(300.0)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_fail_fast")
    with live_server(["--model", tiny_gguf(folder), *FLAGS, "--chaos", "5:1", "--policy", "fail-fast"],
                     folder) as url:
        yield url


def _stream(url: str, prompt: str) -> list[str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 120, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=T) as r:
        assert r.status_code == 200
        return [e for e in r.read().decode().split("\n\n") if e]


def test_an_unrecoverable_fault_ends_every_stream_in_band_and_refuses_new_requests(served):
    url = served
    with cf.ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(lambda p: _stream(url, p), ["hello world", "to be or", "abc", "xyz"]))
    for events in streams:
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][len("data: "):])
        assert last["error"]["code"] == 503 and "FaultStop" in last["error"]["message"]
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=T)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "service_unavailable"
    health = httpx.get(f"{url}/health", timeout=T)
    assert health.status_code == 503 and health.text.startswith("down: FaultStop")
