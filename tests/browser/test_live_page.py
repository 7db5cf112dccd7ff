"""The live page (GET /) in a real browser: headless Chromium (Debian's, driven by Playwright through its
executable path) against a live ``waferrt serve`` on loopback: the mesh is drawn, a running request appears
with its tokens, a fault armed through the server's fault endpoint (--http-faults, the key) is listed at once and is
recovered when it fires during the request (armed first, so that a slow machine cannot end the request before
the fault is armed); a screenshot goes to docs/serve-live.png when WAFERRT_SCREENSHOT names it, else to the test's
folder. Skipped, with one line, only where no Chromium is installed."""

from __future__ import annotations

import os
import shutil
import threading

import httpx
import pytest
from serving import FLAGS, live_server, tiny_gguf

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
KEY = "test-key"
BROWSER = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # never touches the network

NO_CHROMIUM = "no Chromium installed (apt-get install chromium)"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=NO_CHROMIUM)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    with live_server(["--model", tiny_gguf(folder), *FLAGS, "--api-key", KEY, "--http-faults"], folder) as url:
        yield url


@pytest.fixture
def page(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=BROWSER,
                                                       viewport={"width": 1280, "height": 860})
        try:
            yield context.new_page()
        finally:
            context.close()


def _stream(url: str, body: dict, out: list) -> None:
    """One long streamed completion (the request the page shows running)."""
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            out.append(r.status_code)
            for _ in r.iter_lines():
                pass


def _model(url: str) -> str:
    models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    return models["data"][0]["id"]


def _used_core(url: str) -> list[int]:
    """A core that a stage region books (SRAM > 0 in the state's map): a fault there must be recovered."""
    state = httpx.get(f"{url}/v1/wafer/state", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    sram = state["mesh"]["sram"]
    return next([x, y] for y, row in enumerate(sram) for x, v in enumerate(row) if v > 0)


def test_the_page_shows_the_mesh_a_running_request_and_a_fault_recovered(server, page, tmp_path):
    page.goto(f"{server}/#key={KEY}", wait_until="load", timeout=30_000)
    page.wait_for_function("document.getElementById('meshinfo').textContent.includes('16x16')", timeout=30_000)
    assert page.eval_on_selector("#sram", "c => c.width") >= 16  # the SRAM heatmap is drawn
    assert page.locator("#health").text_content() == "ok"

    short = {"model": _model(server), "prompt": "first", "max_tokens": 4}  # the latency panel has one to show
    assert httpx.post(f"{server}/v1/completions", json=short, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60).status_code == 200
    fault = {"kind": "core", "core": _used_core(server), "when": {"step": 3}}  # fires at the next request's 3rd step
    r = httpx.post(f"{server}/v1/wafer/faults", json=fault, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 200, r.text
    page.wait_for_selector("tr[data-testid=fault][data-state=armed]", timeout=60_000)  # listed once armed
    got: list = []
    body = {"model": _model(server), "prompt": "the wafer page", "max_tokens": 140, "stream": True,
            "ignore_eos": True}
    runner = threading.Thread(target=_stream, args=(server, body, got), daemon=True)
    runner.start()
    page.wait_for_selector("tr[data-testid=request]", timeout=120_000)  # the request appears, with its tokens
    page.wait_for_selector("tr[data-testid=fault][data-state=recovered]", timeout=180_000)  # fired and recovered
    page.wait_for_function("document.getElementById('wall-ttft').textContent !== '-'", timeout=30_000)
    page.wait_for_function("document.getElementById('linkmax').textContent.endsWith(' B')", timeout=30_000)
    shot = os.environ.get("WAFERRT_SCREENSHOT") or str(tmp_path / "serve-live.png")
    page.screenshot(path=shot, full_page=True)
    assert os.path.getsize(shot) > 10_000
    runner.join(120)
    assert got == [200] and not runner.is_alive()
