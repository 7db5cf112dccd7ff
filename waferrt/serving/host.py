"""The host's side of a decode that runs on its own: hand the requests over, watch the tokens stream back.

Contract: :class:`Decode` is what the host needs of a running wafer decode (the in-process LocalDecoder or
the Ray-backed WaferLLM): ``start()``, ``submit(subs)``, ``events(timeout)`` (the TokenEvents that came
back, [] when none did within timeout; raises the error of a tile that failed), and ``stop() -> the stage
runs of every tile``. :func:`serve` runs one batch of requests through it:
submits them all (request i samples with ``default_rng([seed, i])``), streams each token to ``on_token``
as it comes (with ``keep_logits``, every token's logits too, into ``Completion.logits``), returns the
completions and the stats -- wall time, inter-token latency, and the modelled wafer time of what ran
(waferrt.decode.schedule.flow_seconds: every request at its own pace). The tiles stop when every request has ended,
also when a tile or the host fails or is interrupted: then the error is raised with the completions so
far attached (``error.completions``: nothing already produced is lost).
"""

from __future__ import annotations

import time
from typing import Protocol

from waferrt.decode.schedule import flow_seconds
from waferrt.decode.setup import DecodeSetup
from waferrt.model.sampling import Sampler

from .engine import Submission, TokenEvent
from .requests import Completion, GenRequest, GenStats, OnToken

WAIT_S = 0.05  # how long one wait for events lasts (the caller's liveness checks run between waits)


class Decode(Protocol):
    def start(self) -> None: ...

    def submit(self, subs: list[Submission]) -> None: ...

    def events(self, timeout: float) -> list[TokenEvent]: ...

    def stop(self) -> list: ...


def serve(decode: Decode, setup: DecodeSetup, clock_hz: float, requests: list[GenRequest], sampler: Sampler,
          on_token: OnToken | None = None, keep_logits: bool = False) -> tuple[list[Completion], GenStats]:
    out, stats = [Completion(r.prompt_ids) for r in requests], GenStats()
    t0 = time.perf_counter()
    decode.start()
    try:
        decode.submit([Submission(i, r, sampler, keep_logits) for i, r in enumerate(requests)])
        _stream(decode, out, stats, on_token)
    except BaseException as e:
        e.completions = out  # what was produced before the failure is not lost
        decode.stop()
        raise
    runs = decode.stop()
    stats.wall_s = time.perf_counter() - t0
    stats.tokens = sum(len(c.tokens) for c in out)
    stats.steps, stats.runs = len({r.mb for r in runs}), runs
    stats.modelled_s = flow_seconds(runs, len(setup.stages()) - 1, clock_hz)
    return out, stats


def _stream(decode: Decode, out: list[Completion], stats: GenStats, on_token: OnToken | None) -> None:
    """Take events until every request has ended; tokens go into the completions as they come."""
    pending, last = set(range(len(out))), {}
    while pending:
        for ev in decode.events(WAIT_S):
            done, now = out[ev.index], time.perf_counter()
            if ev.token >= 0:
                done.tokens.append(ev.token)
                if ev.logits is not None:
                    done.logits.append(ev.logits)
                if ev.index in last:  # decode-only latency: from one token of a request to its next
                    stats.token_latency_s.append(now - last[ev.index])
                last[ev.index] = now
                if on_token:
                    on_token(ev.index, ev.token, ev.finish)
            if ev.finish:
                done.finish = ev.finish
                pending.discard(ev.index)
