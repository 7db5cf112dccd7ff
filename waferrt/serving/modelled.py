"""One request's times on the modelled wafer, read off a flow schedule of the stage runs it took part in.

Contract: :func:`request_times(sched, req, prompt_len, tokens)` takes a flow schedule
(waferrt.decode.schedule.flow_schedule: (request, pos, stage) -> (region, start, end) in seconds) and returns
the request's :class:`ModelledTimes`: time to first token = from the start of its first stage run to the end
of its prompt's last position (the run whose logits give its first token), time per output token = from
there to the end of the position that gave its last token, over the tokens after the first, end to end = the
two together. A time whose positions the schedule does not hold (a request a recovery crossed: its first
positions ran in an attempt before) is None. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelledTimes:
    ttft_s: float | None = None
    tpot_s: float | None = None  # None too for a request of one token
    e2e_s: float | None = None


def request_times(sched: dict, req: int, prompt_len: int, tokens: int) -> ModelledTimes:
    start, ends = None, {}
    for (r, pos, _), (_, s, e) in sched.items():
        if r != req:
            continue
        start = s if start is None else min(start, s)
        ends[pos] = max(ends.get(pos, 0.0), e)
    first, last = ends.get(prompt_len - 1), ends.get(prompt_len + tokens - 2)
    if start is None or first is None or tokens < 1:
        return ModelledTimes()
    tpot = (last - first) / (tokens - 1) if tokens > 1 and last is not None else None
    return ModelledTimes(first - start, tpot, (last if last is not None else first) - start)
