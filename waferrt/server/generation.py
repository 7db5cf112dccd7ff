"""One HTTP request's generation: handed to the runner, its tokens turned into text and OpenAI-shaped answers.

Contract: :func:`start(served, asked, kind)` hands the request to the runner (raises ApiError 429 with
Retry-After when the queue is full, 503 when the wafer is down -- before any byte is sent) and returns a
:class:`Generation`. ``updates()`` yields the runner's Updates, each within ``TOKEN_S`` (else the request is
cancelled and ends in error: never a hung connection); ``text`` turns tokens into text as ``waferrt generate``
prints it (special tokens skipped) and ends the request at a stop string (the string and what follows are
not returned; the runner is told to cancel). ``body()`` is the whole (non-streamed) answer, ``chunks()`` the
streamed one as SSE lines (``data: {json}\\n\\n``, the usage chunk with ``choices: []`` when asked, then
``data: [DONE]``; an error after the first byte goes in-band as an error chunk, then [DONE]).
``close()`` cancels a request that has not ended (a client that went away). Usage is exact: prompt tokens,
and the tokens generated up to the end (the stop string's last token included).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from waferrt.model.tokenizer import StreamDecoder
from waferrt.serving.requests import GenRequest

from .protocol import ApiError, Asked, Kind
from .runner import Busy, Down, Job, Update

TOKEN_S = 300.0  # the longest wait for a request's next token (a recovery with weights reloaded included)
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Served:
    """What every request needs: the runner, the tokenizer, the model's name and limits, the metrics."""

    runner: object
    tok: object
    limits: object
    metrics: object


def start(served: Served, asked: Asked, kind: Kind) -> Generation:
    from .metrics import Timing

    loop, q = asyncio.get_running_loop(), asyncio.Queue()
    timing = Timing()
    job = Job(GenRequest(asked.prompt_ids, asked.max_tokens, asked.stop_ids), asked.sampler,
              lambda u: loop.call_soon_threadsafe(q.put_nowait, u), timing.arrived)
    try:
        rid = served.runner.submit(job)
    except Busy as e:
        raise ApiError(429, f"the server is full ({e}); retry after {RETRY_AFTER_S}s", "rate_limit_error") from None
    except Down as e:
        raise ApiError(503, f"the wafer is not serving ({e})", "service_unavailable") from None
    return Generation(served, asked, kind, rid, q, timing)


class Generation:
    def __init__(self, served: Served, asked: Asked, kind: Kind, rid: int, q: asyncio.Queue, timing):
        self.served, self.asked, self.kind, self.rid, self.q, self.timing = served, asked, kind, rid, q, timing
        self.id = f"{'chatcmpl' if kind is Kind.CHAT else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tokens: list[int] = []
        self.stream = StreamDecoder(served.tok, skip_special=True)
        self.full, self.sent = "", 0  # the text so far, and how much of it was handed out
        self.finish, self.ended, self.metrics = None, False, None
        self.over = False  # the runner has ended it, or was told to

    async def updates(self):
        while not self.ended:
            try:
                u: Update = await asyncio.wait_for(self.q.get(), TOKEN_S)
            except asyncio.TimeoutError:
                u = Update(-1, f"error: no token came within {TOKEN_S:.0f}s")
                self.served.runner.cancel(self.rid)
            if u.token >= 0:
                self.timing.token()
                self.tokens.append(u.token)
                self.full += self.stream.push(u.token)
            if u.finish:
                self.over = True
                self.full = self.served.tok.decode(self.tokens, skip_special=True)  # as generate prints it
                self._end(u.finish, u)
            elif self._stopped():
                self._end("stop", None)
                self.close()
            yield u

    def _stopped(self) -> bool:
        cut = min((i for i in (self.full.find(s, max(0, self.sent - len(s))) for s in self.asked.stop) if i >= 0),
                  default=-1)
        if cut >= 0:
            self.full = self.full[:cut]
        return cut >= 0

    def _end(self, finish: str, u: Update | None) -> None:
        self.ended, self.finish = True, finish
        if self.asked.stop and finish in ("stop", "length"):
            self._stopped()
        self.timing.queued_s = u.queued_s if u is not None else None
        self.metrics = self.served.metrics.finished(self.timing, finish, self.usage(), u.modelled if u else None)

    def text_delta(self) -> str:
        """The text not handed out yet; while the request goes on, what a stop string may still begin is held."""
        hold = 0 if self.ended else max((len(s) - 1 for s in self.asked.stop), default=0)
        upto = max(self.sent, len(self.full) - hold)
        out, self.sent = self.full[self.sent:upto], upto
        return out

    def usage(self) -> dict:
        p, c = len(self.asked.prompt_ids), len(self.tokens)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def close(self) -> None:
        """Cancel the request if the runner has not ended it (a stop string, a client gone: counted as abort)."""
        if not self.ended:
            self._end("abort", None)
        if not self.over:
            self.over = True
            self.served.runner.cancel(self.rid)

    def _error(self) -> ApiError | None:
        if self.finish and self.finish.startswith(("error", "refused")):
            return ApiError(503, f"the request could not finish: {self.finish}", "service_unavailable")
        return None

    # -- answers ---------------------------------------------------------------------------------------------
    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.served.limits.model}

    def _choice(self, text: str, finish: str | None, delta: bool) -> dict:
        if self.kind is Kind.COMPLETION:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        key = "delta" if delta else "message"
        msg = {"content": text} if delta and self.sent > len(text) else {"role": "assistant", "content": text}
        return {"index": 0, key: msg, "logprobs": None, "finish_reason": finish}

    async def body(self) -> dict:
        async for _ in self.updates():
            pass
        err = self._error()
        if err is not None:
            raise err
        out = self._head(self.kind.value)
        out["choices"] = [self._choice(self.full, self.finish, delta=False)]
        return out | {"usage": self.usage(), "metrics": self.metrics}

    async def chunks(self):
        obj = "chat.completion.chunk" if self.kind is Kind.CHAT else "text_completion"
        try:
            async for _ in self.updates():
                text = self.text_delta()
                err = self._error()
                if err is not None:
                    yield _sse(err.body())
                    break
                if text or self.ended:
                    finish = self.finish if self.ended else None
                    yield _sse(self._head(obj) | {"choices": [self._choice(text, finish, delta=True)]}
                               | ({"metrics": self.metrics} if self.ended else {}))
            if self.asked.include_usage and self._error() is None:
                yield _sse(self._head(obj) | {"choices": [], "usage": self.usage()})
            yield "data: [DONE]\n\n"
        finally:
            self.close()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
