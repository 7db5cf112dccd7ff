"""The OpenAI-compatible HTTP API of a wafer that serves: a Starlette app, run by uvicorn in the driver.

Contract: :func:`make_app(served, options) -> Starlette`. Routes (shaped as vLLM's OpenAI server's):
``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (waferrt.server.generation),
``POST /tokenize``, ``POST /detokenize``, ``GET /health`` (200 "ok"; 503 with the reason while recovering
or down), ``GET /metrics`` (Prometheus text, waferrt.server.metrics), ``GET /version``; for the live page
``GET /v1/wafer/state`` (JSON, waferrt.server.state) and ``GET /v1/wafer/events`` (the same as SSE, every
``EVENT_S``); ``POST /v1/wafer/faults`` arms a fault (waferrt.faults.model.fault_from's dict) only when
``options.faults`` is on, and always needs the key. Static files (the live page) are served at ``/`` from
``STATIC`` (waferrt/server/static/: index.html and what it loads) when that folder exists.
Every error is OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``, protocol.ApiError):
400 bad fields or malformed JSON, 401 without the key (``Authorization: Bearer KEY``) on ``/v1/*``,
``/tokenize`` and ``/detokenize`` when one is set, 404, 405, 400 a body over ``MAX_BODY``, 429/503 with
``Retry-After``; never a traceback (500 says only the error's kind).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.staticfiles import StaticFiles

from waferrt import __version__

from .generation import RETRY_AFTER_S, Served, start
from .protocol import ApiError, Kind, bad, parse
from .state import StateView

MAX_BODY = 1 << 20  # bytes of a request body at most
EVENT_S = 0.5  # how often the state feed sends
FEED_S = 3600.0  # how long one state feed lasts (an EventSource reconnects)
STATIC = Path(__file__).parent / "static"  # the live page (written by the page's author; served at / if present)
OPEN = ("/health", "/metrics", "/version")  # what needs no key


@dataclass(frozen=True)
class Options:
    api_key: str | None = None
    faults: bool = False  # POST /v1/wafer/faults allowed (with the key)


def make_app(served: Served, options: Options) -> Starlette:
    state = StateView(served)

    async def models(request: Request) -> Response:
        m = served.limits.model
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                                         "owned_by": "waferrt", "root": m, "parent": None,
                                                         "max_model_len": served.limits.kv_tokens}]})

    async def completions(request: Request) -> Response:
        return await _generate(served, request, Kind.COMPLETION)

    async def chat(request: Request) -> Response:
        return await _generate(served, request, Kind.CHAT)

    async def tokenize(request: Request) -> Response:
        body = await _json(request)
        if "messages" in body:
            ids = parse(body | {"max_tokens": 1, "stream": False}, Kind.CHAT, served.limits, served.tok).prompt_ids
        else:
            ids = parse(body | {"max_tokens": 1, "stream": False}, Kind.COMPLETION, served.limits,
                        served.tok).prompt_ids
        return JSONResponse({"count": len(ids), "max_model_len": served.limits.kv_tokens, "tokens": list(ids)})

    async def detokenize(request: Request) -> Response:
        body = await _json(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise bad("tokens must be a list of token ids", "tokens")
        if not all(0 <= i < served.limits.vocab for i in ids):
            raise bad(f"token ids must be in 0..{served.limits.vocab - 1}", "tokens")
        return JSONResponse({"prompt": served.tok.decode(ids)})

    async def health(request: Request) -> Response:
        h = served.runner.health
        return PlainTextResponse(h, 200 if h == "ok" else 503,
                                 headers=None if h == "ok" else {"Retry-After": str(RETRY_AFTER_S)})

    async def metrics(request: Request) -> Response:
        return Response(served.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def version(request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def wafer_state(request: Request) -> Response:
        return JSONResponse(state())

    async def wafer_events(request: Request) -> Response:
        async def feed():
            end = time.monotonic() + FEED_S
            while time.monotonic() < end and not await request.is_disconnected():
                yield f"data: {json.dumps(state(), separators=(',', ':'))}\n\n"
                await asyncio.sleep(EVENT_S)
        return StreamingResponse(feed(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def wafer_faults(request: Request) -> Response:
        from waferrt.faults.model import fault_from

        if not (options.faults and options.api_key):
            raise ApiError(403, "fault injection over HTTP is off: serve with --http-faults and --api-key",
                           "permission_error")
        try:
            fault = fault_from(await _json(request))
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"not a fault: {e}; e.g. {{\"kind\": \"straggler\", ...}} as a fault plan lists them") from None
        try:
            index = await asyncio.to_thread(served.runner.inject, fault)
        except ValueError as e:
            raise bad(str(e)) from None
        return JSONResponse({"index": index})

    routes = [Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]), Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"]), Route("/health", health),
              Route("/metrics", metrics), Route("/version", version), Route("/v1/wafer/state", wafer_state),
              Route("/v1/wafer/events", wafer_events), Route("/v1/wafer/faults", wafer_faults, methods=["POST"])]
    if STATIC.is_dir():  # the page's files by name: a Mount at / would answer GET /v1/completions 404, not 405
        page = StaticFiles(directory=STATIC, html=True)
        routes += [Route(p, page) for p in ["/", *(f"/{f.name}" for f in sorted(STATIC.iterdir()) if f.is_file())]]
    app = Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                                       Exception: _crash})
    app.add_middleware(_Guard, key=options.api_key)
    return app


async def _generate(served: Served, request: Request, kind: Kind) -> Response:
    asked = parse(await _json(request), kind, served.limits, served.tok)
    gen = start(served, asked, kind)
    if asked.stream:
        return StreamingResponse(gen.chunks(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    waiter = asyncio.ensure_future(gen.body())
    try:
        while not waiter.done():  # a client that went away cancels its request
            await asyncio.wait({waiter}, timeout=0.5)
            if not waiter.done() and await request.is_disconnected():
                waiter.cancel()
                gen.close()
                return Response(status_code=499)
        return JSONResponse(waiter.result())
    finally:
        if not waiter.done():
            waiter.cancel()
            gen.close()


async def _json(request: Request):
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY:
            raise bad(f"the request body is over {MAX_BODY} bytes; send a smaller one")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the body is not valid JSON ({e}); send a JSON object") from None


def _headers(status: int) -> dict | None:
    return {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None


async def _api_error(request: Request, e: ApiError) -> Response:
    return JSONResponse(e.body(), e.status, headers=_headers(e.status))


async def _http_error(request: Request, e: HTTPException) -> Response:
    kinds = {404: "not_found_error", 405: "invalid_request_error"}
    err = ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                   kinds.get(e.status_code, "invalid_request_error"))
    return JSONResponse(err.body(), e.status_code)


async def _crash(request: Request, e: Exception) -> Response:
    err = ApiError(500, f"the server failed on this request ({type(e).__name__}); it has been logged", "server_error")
    return JSONResponse(err.body(), 500)


class _Guard:
    """The API key (Bearer) on every path but OPEN and the page's static files; a body over MAX_BODY by its
    Content-Length refused before it is read."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        path = scope["path"]
        err = None
        if self.key and path not in OPEN and (path.startswith("/v1/") or path in ("/tokenize", "/detokenize")):
            got = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.key}".encode()):
                err = ApiError(401, "a valid API key is needed: send the header Authorization: Bearer <key>",
                               "authentication_error")
        length = headers.get(b"content-length", b"0")
        if err is None and length.isdigit() and int(length) > MAX_BODY:
            err = bad(f"the request body is over {MAX_BODY} bytes; send a smaller one")
        if err is not None:
            return await JSONResponse(err.body(), err.status)(scope, receive, send)
        return await self.app(scope, receive, send)
