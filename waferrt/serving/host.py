"""The host's side of a decode that runs on its own: hand the requests over, watch the tokens stream back.

Contract: :class:`Decode` is what the host needs of a running wafer decode (the in-process LocalDecoder or
the Ray-backed WaferLLM): ``start()``, ``submit(subs)``, ``events(timeout)`` (the TokenEvents that came
back, [] when none did within timeout; raises the error of a tile that failed), and ``stop() -> the stage
runs of every tile``. :func:`serve` runs one :class:`~waferrt.serving.requests.Batch` of requests through it:
submits them all (request i samples with ``default_rng([seed, i])``), streams each token to ``on_token``
as it comes (with ``keep_logits``, every token's logits too, into ``Completion.logits``), returns the
completions and the stats -- wall time, inter-token latency, and the modelled wafer time of what ran
(waferrt.decode.schedule.flow_seconds: every request at its own pace). The tiles stop when every request has ended,
also when a tile or the host fails or is interrupted: then the error is raised with the completions so
far attached (``error.completions``: nothing already produced is lost). A decode that can recover
(``recover``: waferrt.recovery for the tile actors) is repaired instead, and every unfinished request
resumes where it was (waferrt.serving.recovery.resume: replayed, with its RNG where it was;
:func:`repair` is that repair, for whoever drives a decode by hand: waferrt.server), so the
tokens are those of a run without the fault; ``stats.faults`` lists what happened
(waferrt.faults.events). With ``trace`` (a path, or True to keep it in memory only) the tiles record what
they do (the Decode's ``trace_start`` / ``trace_stop``) and the host its own track
(waferrt.serving.trace.DecodeTrace), with every fault's firing, detection and recovery as instants: kept
in ``stats.trace``, written to the path -- also when the decode fails, with what could still be collected.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from waferrt.decode.schedule import flow_schedule, flow_seconds, no_gc, schedule_seconds
from waferrt.decode.setup import DecodeSetup
from waferrt.faults.errors import FaultError, FaultStop, Unrecoverable

from .engine import Submission, TokenEvent
from .recovery import resume
from .requests import Batch, Completion, GenStats, OnToken
from .trace import DecodeTrace

WAIT_S = 0.05  # how long one wait for events lasts (the caller's liveness checks run between waits)


class Decode(Protocol):
    def start(self) -> None: ...

    def submit(self, subs: list[Submission]) -> None: ...

    def events(self, timeout: float) -> list[TokenEvent]: ...

    def stop(self) -> list: ...

    def trace_start(self) -> None: ...

    def trace_stop(self) -> dict[str, list]: ...

    # A decode that can recover from faults also has ``recover(error) -> the stage runs of the failed
    # attempt`` (it repairs the wafer and starts the loops again, or raises what cannot be recovered),
    # ``setup`` (after a recovery, the repaired placement's) and ``log`` (waferrt.faults.events.FaultLog).


def serve(decode: Decode, setup: DecodeSetup, clock_hz: float, batch: Batch, on_token: OnToken | None = None,
          trace: str | Path | bool | None = None) -> tuple[list[Completion], GenStats]:
    requests = batch.requests
    out, stats = [Completion(r.prompt_ids) for r in requests], GenStats()
    log = stats.trace = DecodeTrace(setup, clock_hz) if trace else None
    host = log.host if log is not None else None
    t0, t0_ns = time.perf_counter(), time.time_ns()
    stats.started = t0
    if log is not None:
        decode.trace_start()
    try:
        with _span(host, "start"):
            decode.start()
        setup = _attempts(decode, setup, clock_hz, batch, _Sink(out, stats, on_token, host))
    except BaseException as e:
        e.completions = out  # what was produced before the failure is not lost
        decode.stop()
        _faults(decode, stats, log)
        if log is not None:
            log.instant("error", None, type=type(e).__name__, msg=str(e))
            _end_trace(decode, log, trace, [])
        raise
    with _span(host, "stop"), no_gc():  # thousands of stage runs unpickled
        runs = decode.stop()
    sched = flow_schedule(runs, len(setup.stages()) - 1, clock_hz)  # once: the modelled time, the first tokens
    _account(stats, runs, schedule_seconds(sched))
    _first_tokens(stats, sched, out)
    stats.wall_s = time.perf_counter() - t0
    stats.tokens = sum(len(c.tokens) for c in out)
    _faults(decode, stats, log)
    if log is not None:
        host.add("decode", "host", t0_ns, time.time_ns(), requests=len(requests))
        _end_trace(decode, log, trace, runs)
    return out, stats


@dataclass(frozen=True, eq=False)
class _Sink:
    """Where a decode's tokens go as they come: the completions, the stats, the caller's on_token, and the
    host's trace track (None: no trace)."""

    out: list[Completion]
    stats: GenStats
    on_token: OnToken | None
    host: object = None


def _attempts(decode: Decode, setup: DecodeSetup, clock_hz: float, batch: Batch, sink: _Sink) -> DecodeSetup:
    """Submit and stream until every request has ended; after a fault, recover (when the decode can) and
    resume every unfinished request. The setup the last attempt ran on."""
    requests, sampler, keep_logits, host = batch.requests, batch.sampler, batch.keep_logits, sink.host
    subs = [Submission(i, r, sampler, keep_logits) for i, r in enumerate(requests)]
    while True:
        try:
            with _span(host, "submit", requests=len(subs)):
                decode.submit(subs)
            _stream(decode, sink)
            return setup
        except Exception as e:
            if not hasattr(decode, "recover") or isinstance(e, (Unrecoverable, FaultStop)):
                raise
            with _span(host, "recover", error=type(e).__name__):
                runs = repair(decode, e)
            _account(sink.stats, runs, flow_seconds(runs, len(setup.stages()) - 1, clock_hz, partial=True))
            setup = decode.setup
            subs = resume(requests, sink.out, sampler, keep_logits)


def repair(decode: Decode, error: Exception) -> list:
    """Repair the wafer after `error` (the decode's own recover; a fault while recovering is recovered from
    in turn); what cannot be recovered (Unrecoverable, FaultStop: the decode's own verdict) is raised."""
    while True:
        try:
            return decode.recover(error)
        except FaultError:
            raise
        except Exception as e:  # noqa: BLE001 - another fault struck during the recovery
            error = e


def _account(stats: GenStats, runs: list, modelled_s: float) -> None:
    """Add one attempt's stage runs (the decode, or its part before a fault) and their modelled seconds
    (waferrt.decode.schedule) to the stats."""
    stats.runs += runs
    stats.steps += len({r.mb for r in runs})
    stats.modelled_s += modelled_s


def _first_tokens(stats: GenStats, sched: dict, out: list[Completion]) -> None:
    """Each request's modelled time to first token: when its prompt's last position leaves the head in the
    flow schedule of the last attempt's stage runs."""
    last = {i: len(c.prompt_ids) - 1 for i, c in enumerate(out)}
    for (req, pos, _), (_, _, end) in sched.items():
        if last.get(req) == pos:
            stats.ttft_modelled_s[req] = max(stats.ttft_modelled_s.get(req, 0.0), end)


def _faults(decode: Decode, stats: GenStats, log: DecodeTrace | None) -> None:
    """The faults of the decode into the stats (and the trace, as instants)."""
    stats.faults = list(decode.log.events) if getattr(decode, "log", None) else []
    if log is not None:
        log.faults(stats.faults)


def _span(host, name: str, **args):
    return nullcontext() if host is None else host.span(name, "host", **args)


def _end_trace(decode: Decode, log: DecodeTrace, path, runs: list) -> None:
    """Collect the tiles' tracks (what can be: after a failure, a dead tile's is lost) and write the file."""
    try:
        log.add_tiles(decode.trace_stop())
    except Exception as e:  # noqa: BLE001 - a failed wafer cannot hand its tracks back; the host's remains
        log.instant("tracks lost", None, type=type(e).__name__, msg=str(e))
    log.finish(runs)
    if not isinstance(path, bool):
        log.write(path)


def _stream(decode: Decode, sink: _Sink) -> None:
    """Take events until every request has ended; tokens go into the completions as they come."""
    out, stats, on_token, host = sink.out, sink.stats, sink.on_token, sink.host
    pending, last = {i for i, c in enumerate(out) if not c.finish}, {}
    while pending:
        for ev in decode.events(WAIT_S):
            done, now = out[ev.index], time.perf_counter()
            if host is not None:
                host.instant("token", "token", request=ev.index, token=ev.token, finish=ev.finish)
            if ev.token >= 0:
                done.tokens.append(ev.token)
                if ev.logits is not None:
                    done.logits.append(ev.logits)
                if ev.index in last:  # decode-only latency: from one token of a request to its next
                    stats.token_latency_s.append(now - last[ev.index])
                else:
                    stats.ttft_wall_s[ev.index] = now - stats.started
                last[ev.index] = now
                if on_token:
                    on_token(ev.index, ev.token, ev.finish)
            if ev.finish:
                done.finish = ev.finish
                pending.discard(ev.index)
