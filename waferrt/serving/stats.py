"""A serving benchmark's numbers from what each request saw: vLLM's benchmark client's formulas, pure.

Contract: :class:`Timing` is one request's times (seconds: to its first token, end to end, and the gaps
between the chunks that followed the first), wall-clock as the client measured them or modelled as the
server reported them; :class:`Outcome` one request's result (success, its prompt and output token counts
from the response's ``usage``, its two timings). :func:`summarize` turns the outcomes of a run of
``duration_s`` seconds into a :class:`Summary` whose every figure is the one vLLM's
``benchmarks/serve.py`` (``calculate_metrics``) computes:

- TPOT of a request = (latency - TTFT) / (output tokens - 1), only for requests of more than one output
  token (for goodput a one-token request's TPOT counts as 0);
- ITL = every gap between consecutive chunks of every request, pooled;
- throughputs = completed requests, output tokens, input + output tokens over the run's duration;
- goodput = completed requests that meet every SLO given (TTFT, TPOT, e2e; a figure equal to its SLO
  meets it) over the duration;
- a :class:`Spread` (mean, median, p90, p99 in ms) is numpy's mean, median and linearly interpolated
  percentile; of no value it is all zeros (``np.mean(x or 0)``, as vLLM writes it), except ITL, which is
  None when no request reported a gap (modelled times come without them).

No sockets, no clock: the HTTP client (waferrt.cli.loadgen) measures, this module only counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

PERCENTILES = (90, 99)


@dataclass(frozen=True)
class Timing:
    """One request's times in seconds: to its first token, end to end, and the gaps between its chunks."""

    ttft_s: float
    latency_s: float
    itl_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.ttft_s <= self.latency_s:
            raise ValueError(f"a request's time to first token ({self.ttft_s}) is between 0 and its latency "
                             f"({self.latency_s}); measure both from when the request was sent")

    def tpot_s(self, output_tokens: int) -> float:
        """(latency - TTFT) / (output tokens - 1); 0 for a request of one token or none (vLLM's rule)."""
        return (self.latency_s - self.ttft_s) / (output_tokens - 1) if output_tokens > 1 else 0.0


@dataclass(frozen=True)
class Outcome:
    """One request's result: counts from its ``usage``; ``wall`` as measured, ``modelled`` as the server said
    (None when it said nothing); ``error`` why it failed."""

    success: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    wall: Timing | None = None
    modelled: Timing | None = None
    error: str = ""


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in ms (None: not asked). Written ``ttft:MS,tpot:MS,e2el:MS``, any subset."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @staticmethod
    def parse(text: str) -> Slo:
        keys, out = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2el_ms"}, {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition(":")
            try:
                ms = float(value)
            except ValueError:
                ms = -1.0
            if name not in keys or not ms > 0 or name in out:
                raise ValueError(f"--slo takes name:milliseconds pairs, each name once, from ttft, tpot, e2el "
                                 f"(e.g. ttft:500,tpot:50), not {part!r}")
            out[name] = ms
        return Slo(**{keys[k]: v for k, v in out.items()})

    @property
    def asked(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def met(self, timing: Timing, output_tokens: int) -> bool:
        """Whether every objective asked holds for this request (a figure equal to its objective meets it)."""
        pairs = ((self.ttft_ms, timing.ttft_s), (self.tpot_ms, timing.tpot_s(output_tokens)),
                 (self.e2el_ms, timing.latency_s))
        return all(ms / 1000 >= s for ms, s in pairs if ms is not None)


@dataclass(frozen=True)
class Spread:
    """Mean, median, p90 and p99 of some seconds, in milliseconds."""

    mean_ms: float
    median_ms: float
    p90_ms: float
    p99_ms: float

    @staticmethod
    def of(seconds: list[float]) -> Spread:
        x = np.asarray(seconds or [0.0], dtype=float) * 1000
        p90, p99 = (float(np.percentile(x, p)) for p in PERCENTILES)
        return Spread(float(np.mean(x)), float(np.median(x)), p90, p99)


@dataclass(frozen=True)
class Latencies:
    """The four spreads of one clock (wall or modelled) over the completed requests."""

    ttft: Spread
    tpot: Spread
    itl: Spread | None  # None when no request reported a gap (the server's modelled times have none)
    e2el: Spread

    @staticmethod
    def of(pairs: list[tuple[Timing, int]]) -> Latencies:
        """From (timing, output tokens) of every completed request; TPOT only where there are 2+ tokens."""
        gaps = [g for t, _ in pairs for g in t.itl_s]
        return Latencies(ttft=Spread.of([t.ttft_s for t, _ in pairs]),
                         tpot=Spread.of([t.tpot_s(n) for t, n in pairs if n > 1]),
                         itl=Spread.of(gaps) if gaps else None,
                         e2el=Spread.of([t.latency_s for t, _ in pairs]))


@dataclass(frozen=True)
class Summary:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests per second
    output_throughput: float  # output tokens per second
    total_token_throughput: float  # input + output tokens per second
    request_goodput: float | None  # requests meeting every SLO per second (None: no SLO asked)
    wall: Latencies
    modelled: Latencies | None  # None when no completed request carried modelled times
    errors: tuple[str, ...] = ()  # one line per failed request

    def to_json(self) -> dict:
        return asdict(self)


def summarize(outcomes: list[Outcome], duration_s: float, slo: Slo = Slo()) -> Summary:
    """The run's numbers (module docstring) from every request's outcome over `duration_s` seconds."""
    if not duration_s > 0:
        raise ValueError(f"a run's duration is positive, not {duration_s}: time it from the first send")
    done = [o for o in outcomes if o.success and o.wall is not None]
    wall = [(o.wall, o.output_tokens) for o in done]
    modelled = [(o.modelled, o.output_tokens) for o in done if o.modelled is not None]
    inp, out = sum(o.prompt_tokens for o in done), sum(o.output_tokens for o in done)
    good = sum(slo.met(t, n) for t, n in wall) / duration_s if slo.asked else None
    return Summary(completed=len(done), failed=len(outcomes) - len(done), duration_s=duration_s,
                   total_input_tokens=inp, total_output_tokens=out, request_throughput=len(done) / duration_s,
                   output_throughput=out / duration_s, total_token_throughput=(inp + out) / duration_s,
                   request_goodput=good, wall=Latencies.of(wall),
                   modelled=Latencies.of(modelled) if modelled else None,
                   errors=tuple(o.error for o in outcomes if not o.success))
