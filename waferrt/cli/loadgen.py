"""The load client: a run of streamed completions sent to an OpenAI-compatible server, timed as vLLM's
benchmark client times them.

Contract: :func:`run_load(target, plan)` sends ``plan.prompts`` to ``target`` (``POST {base}/v1/completions``,
``stream``, ``stream_options.include_usage``, ``ignore_eos``, greedy unless the plan says otherwise), request i
at ``plan.offsets[i]`` seconds after the first and at most ``plan.max_concurrency`` at once, and returns a
:class:`Run`: one :class:`Sent` per request sent (its :class:`waferrt.serving.stats.Outcome`, its text, its
finish reason) and the run's duration (first send to last answer). Wall times are the client's
``time.perf_counter`` (TTFT at the first chunk with text, ITL the gaps between later chunks with text,
latency at ``[DONE]``); token counts are the response's ``usage``; modelled times are the ``metrics``
object the server adds to a response (:func:`modelled_timing`). Every wait has a deadline: each request
``target.timeout_s``, the run ``plan.deadline_s`` (requests still out then count as failed, "deadline");
Ctrl-C ends the run and :func:`run_load` returns what completed (``Run.interrupted``). httpx, asyncio.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from waferrt.serving.stats import Outcome, Timing

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_base_url(url: str, explicit: bool) -> str:
    """`url` without a trailing slash; refuses what is not http(s)://host[:port], and any host off this
    machine unless the user wrote it (`explicit`): the client never sends load anywhere by default."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"--base-url is http://HOST:PORT (e.g. {DEFAULT_BASE_URL}), not {url!r}")
    if not explicit and not is_loopback(url):
        raise ValueError(f"{url} is not on this machine: name a server elsewhere only with --base-url")
    return url.rstrip("/")


@dataclass(frozen=True)
class Target:
    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    model: str | None = None  # None: the first of GET /v1/models
    timeout_s: float = 300.0  # one request, connect to [DONE]

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class Prompt:
    """One request: its prompt (token ids, or text from a prompts file) and the tokens it asks for."""

    prompt: tuple[int, ...] | str
    max_tokens: int


@dataclass(frozen=True)
class Plan:
    prompts: tuple[Prompt, ...]
    offsets: tuple[float, ...]  # when each is sent, seconds after the first
    max_concurrency: int | None = None
    deadline_s: float = 600.0  # the whole run
    sampling: tuple[tuple[str, object], ...] = (("temperature", 0.0),)  # more fields of every request

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.prompts):
            raise ValueError(f"a plan has one send time per prompt, not {len(self.offsets)} for "
                             f"{len(self.prompts)}")


@dataclass
class Sent:
    outcome: Outcome
    text: str = ""
    finish: str = ""
    max_tokens: int = 0  # what it asked for


@dataclass
class Run:
    sent: dict = field(default_factory=dict)  # request index -> Sent, in the order they finished
    duration_s: float = 0.0
    interrupted: bool = False
    model: str = ""


def modelled_timing(metrics: dict | None) -> Timing | None:
    """The modelled wafer's times of a response (its ``metrics.modelled``: ``ttft_s``, ``e2e_s``), or None
    when the server gave none (a request a recovery crossed has none)."""
    m = (metrics or {}).get("modelled") or {}
    ttft, e2e = m.get("ttft_s"), m.get("e2e_s")
    return Timing(ttft, e2e) if isinstance(ttft, (int, float)) and isinstance(e2e, (int, float)) else None


class Stream:
    """What one streamed response said, fed one SSE ``data:`` payload at a time."""

    def __init__(self, sent_at: float):
        self.sent_at, self.stamps, self.text, self.finish = sent_at, [], [], ""
        self.usage, self.metrics, self.error, self.done = None, None, "", False
        self.status, self.chunks = None, 0  # the response's HTTP status once its headers came; data: lines

    def feed(self, payload: str, now: float) -> None:
        self.chunks += 1
        if payload == "[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            self.error = str(chunk["error"].get("message", chunk["error"]))
        for choice in chunk.get("choices") or ():
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece:
                self.stamps.append(now)
                self.text.append(piece)
            self.finish = choice.get("finish_reason") or self.finish
        self.usage = chunk.get("usage") or self.usage
        self.metrics = chunk.get("metrics") or self.metrics

    def unanswered(self, timeout_s: float) -> Sent:
        """What a request that ran out of time got: how far its answer came, and the text it had."""
        if self.status is None:
            how = "no response headers: the server never answered"
        else:
            how = (f"HTTP {self.status}, {self.chunks} chunk(s) ({len(self.stamps)} with text), no [DONE] "
                   f"after {(self.stamps[-1] if self.stamps else self.sent_at) - self.sent_at:.1f} s")
        return Sent(Outcome(False, error=f"no answer within {timeout_s} s: {how}"), "".join(self.text))

    def sent(self, end: float) -> Sent:
        if self.error or not self.done or not self.usage:
            why = self.error or ("no [DONE]" if not self.done else "no usage chunk")
            return Sent(Outcome(False, error=why), "".join(self.text), self.finish)
        ttft = (self.stamps[0] if self.stamps else end) - self.sent_at
        gaps = tuple(b - a for a, b in zip(self.stamps, self.stamps[1:]))
        outcome = Outcome(True, self.usage.get("prompt_tokens", 0), self.usage.get("completion_tokens", 0),
                          Timing(ttft, end - self.sent_at, gaps), modelled_timing(self.metrics))
        return Sent(outcome, "".join(self.text), self.finish)


async def _stream(client: httpx.AsyncClient, target: Target, body: dict, stream: Stream) -> Sent | None:
    async with client.stream("POST", "/v1/completions", json=body, headers=target.headers) as r:
        stream.status = r.status_code
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")[:200]
            return Sent(Outcome(False, error=f"HTTP {r.status_code}: {text}"))
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                stream.feed(line[5:].strip(), time.perf_counter())
    return None


async def send(client: httpx.AsyncClient, target: Target, body: dict) -> Sent:
    """One streamed completion; a failure of any kind is a failed Sent with its reason, never raised."""
    stream = Stream(time.perf_counter())
    try:
        refused = await asyncio.wait_for(_stream(client, target, body, stream), target.timeout_s)
    except asyncio.TimeoutError:
        return stream.unanswered(target.timeout_s)
    except (httpx.HTTPError, ValueError) as e:
        return Sent(Outcome(False, error=f"{type(e).__name__}: {e}"))
    return refused or stream.sent(time.perf_counter())


class NoServer(Exception):
    """Nothing usable answers at the base URL (raised before any request is sent)."""


async def served_model(client: httpx.AsyncClient, target: Target) -> str:
    """The model to ask for: the target's, or the first that GET /v1/models lists (which also checks that a
    server answers, within 30 s)."""
    try:
        r = await asyncio.wait_for(client.get("/v1/models", headers=target.headers), 30)
        r.raise_for_status()
        return target.model or r.json()["data"][0]["id"]
    except (httpx.HTTPError, asyncio.TimeoutError, ValueError, KeyError, IndexError) as e:
        raise NoServer(f"no OpenAI-compatible server answers GET {target.base_url}/v1/models ({type(e).__name__}: "
                       f"{e}); start one with 'waferrt serve', or give its address with --base-url") from None


async def _run(target: Target, plan: Plan, run: Run) -> None:
    limits = httpx.Limits(max_connections=plan.max_concurrency or len(plan.prompts) or 1)
    gate = asyncio.Semaphore(plan.max_concurrency or max(1, len(plan.prompts)))
    async with httpx.AsyncClient(base_url=target.base_url, limits=limits,
                                 timeout=httpx.Timeout(target.timeout_s, connect=10.0)) as client:
        run.model = await served_model(client, target)
        start = time.perf_counter()

        async def one(i: int, p: Prompt) -> None:
            await asyncio.sleep(max(0.0, start + plan.offsets[i] - time.perf_counter()))
            async with gate:
                body = {"model": run.model, "prompt": list(p.prompt) if isinstance(p.prompt, tuple) else p.prompt,
                        "max_tokens": p.max_tokens, "stream": True, "ignore_eos": True,
                        "stream_options": {"include_usage": True}, **dict(plan.sampling)}
                sent = await send(client, target, body)
                sent.max_tokens, run.sent[i] = p.max_tokens, sent
            run.duration_s = time.perf_counter() - start

        tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(plan.prompts)]
        try:
            _, pending = await asyncio.wait(tasks, timeout=plan.deadline_s)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for i in range(len(plan.prompts)):
            run.sent.setdefault(i, Sent(Outcome(False, error=f"deadline: not done within {plan.deadline_s} s")))
        run.duration_s = time.perf_counter() - start


def run_load(target: Target, plan: Plan) -> Run:
    """Send the plan's requests (module docstring); on Ctrl-C, what completed until then."""
    run = Run()
    try:
        asyncio.run(_run(target, plan, run))
    except KeyboardInterrupt:
        run.interrupted = True
    return run
