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
far attached (``error.completions``: nothing already produced is lost). A decode that can recover
(``recover``: waferrt.recovery for the tile actors) is repaired instead, and every unfinished request
resumes where it was (waferrt.serving.recovery.resume: replayed, with its RNG where it was), so the
tokens are those of a run without the fault; ``stats.faults`` lists what happened
(waferrt.faults.events).
"""

from __future__ import annotations

import time
from typing import Protocol

from waferrt.decode.schedule import flow_seconds
from waferrt.decode.setup import DecodeSetup
from waferrt.faults.errors import FaultError
from waferrt.model.sampling import Sampler

from .engine import Submission, TokenEvent
from .recovery import resume
from .requests import Completion, GenRequest, GenStats, OnToken

WAIT_S = 0.05  # how long one wait for events lasts (the caller's liveness checks run between waits)


class Decode(Protocol):
    def start(self) -> None: ...

    def submit(self, subs: list[Submission]) -> None: ...

    def events(self, timeout: float) -> list[TokenEvent]: ...

    def stop(self) -> list: ...

    # A decode that can recover from faults also has ``recover(error) -> the stage runs of the failed
    # attempt`` (it repairs the wafer and starts the loops again, or raises what cannot be recovered),
    # ``setup`` (after a recovery, the repaired placement's) and ``log`` (waferrt.faults.events.FaultLog).


def serve(decode: Decode, setup: DecodeSetup, clock_hz: float, requests: list[GenRequest], sampler: Sampler,
          on_token: OnToken | None = None, keep_logits: bool = False) -> tuple[list[Completion], GenStats]:
    out, stats = [Completion(r.prompt_ids) for r in requests], GenStats()
    t0 = time.perf_counter()
    decode.start()
    subs = [Submission(i, r, sampler, keep_logits) for i, r in enumerate(requests)]
    while True:
        try:
            decode.submit(subs)
            _stream(decode, out, stats, on_token)
            break
        except Exception as e:  # a fault: recover (resume every unfinished request) when the decode can
            _account(stats, _recover(decode, e, out), setup, clock_hz, partial=True)
            setup = getattr(decode, "setup", setup)
            subs = resume(requests, out, sampler, keep_logits)
        except BaseException as e:
            _give_up(decode, e, out)
    _account(stats, decode.stop(), setup, clock_hz)
    stats.wall_s = time.perf_counter() - t0
    stats.tokens = sum(len(c.tokens) for c in out)
    stats.faults = list(decode.log.events) if getattr(decode, "log", None) else []
    return out, stats


def _recover(decode: Decode, error: Exception, out: list[Completion]) -> list:
    """Repair the wafer after `error` (the decode's own recover; a fault while recovering is recovered from
    in turn); what cannot be recovered is raised with the completions so far attached."""
    if not hasattr(decode, "recover"):
        _give_up(decode, error, out)
    while True:
        try:
            return decode.recover(error)
        except FaultError as e:  # Unrecoverable, FaultStop: the decode's own verdict
            _give_up(decode, e, out)
        except Exception as e:  # noqa: BLE001 - another fault struck during the recovery
            error = e
        except BaseException as e:
            _give_up(decode, e, out)


def _give_up(decode: Decode, e: BaseException, out: list[Completion]):
    e.completions = out  # what was produced before the failure is not lost
    decode.stop()
    raise e


def _account(stats: GenStats, runs: list, setup: DecodeSetup, clock_hz: float, partial: bool = False) -> None:
    """Add one attempt's stage runs (the decode, or its part before a fault: `partial`) to the stats."""
    stats.runs += runs
    stats.steps += len({r.mb for r in runs})
    stats.modelled_s += flow_seconds(runs, len(setup.stages()) - 1, clock_hz, partial)


def _stream(decode: Decode, out: list[Completion], stats: GenStats, on_token: OnToken | None) -> None:
    """Take events until every request has ended; tokens go into the completions as they come."""
    pending, last = {i for i, c in enumerate(out) if not c.finish}, {}
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
