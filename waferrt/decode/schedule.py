"""The modelled time of a decode: the stage runs the tiles booked, scheduled as the wafer would run them.

Contract: a :class:`StageRun` is one stage run on one micro-batch as a tile booked it: ``cycles``, the
micro-batch's cost as it ran (the emulator computes a lane's tokens together: one pass over the weights), and
per item an :class:`Item` with the cycles that token takes *alone* (waferrt.decode.cost.alone_cycles: the
closed forms, equal to what the tiles book for a micro-batch of one; at an MoE layer the routed work is the
token's share of its micro-batch's as it ran instead -- the busiest expert block, the all-to-all as routed,
NI-Balancer's migration: waferrt.decode.moe.MoEStep -- since the experts run once per micro-batch). The wafer
runs every request at its own pace, so :func:`flow_seconds` schedules tokens, not micro-batches: every region
is its own hardware and serves the tokens in the order they reach it; token (request, pos) is ready for stage
s when it left stage s-1, and for the embedding after its request's previous token entered and -- when that
token's logits gave this one -- after that token left the head. How the emulator grouped the tokens into
micro-batches does not change the modelled time (but at an MoE layer: the step's tokens share their experts'
run); a token's consecutive stages on one region (a strategy's group of layers) are one task there, run back
to back as the tile runs its segment (:func:`flow_schedule`: when every token ran at every stage; a trace
shows it next to the wall clock). :func:`round_seconds` is the length of a decode's last round (every
request's last token); :func:`requests_round_seconds` the steady round of R requests decoding at their own
pace, from closed forms alone (the estimate of a placement), and :func:`round_bound_seconds` the bound it
never goes below (what the busiest region must serve, or one token's way round)."""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from waferrt.core.mesh import Region


class Item(NamedTuple):
    request: int  # the request's number
    pos: int  # the token's position in its request
    want: bool  # its logits give the request's next token
    alone: float  # cycles this stage takes on this token alone (an MoE layer: with its share of the routed work)


@dataclass(frozen=True)
class StageRun:
    """One stage run on one micro-batch, as a tile booked it."""

    mb: int  # micro-batch number
    stage: int
    region: Region  # the hardware that ran it (the embedding and the head share one)
    seq: int  # the order its tile ran it in
    cycles: float  # the micro-batch as it ran, the hand-over into the region included
    items: tuple[Item, ...]  # its tokens, in order

    def __reduce__(self):
        """Pickled with its items as plain tuples: a decode's thousands of runs cross from the tiles to the
        host at its end (4x faster to pickle than as named tuples)."""
        return _stage_run, (self.mb, self.stage, self.region, self.seq, self.cycles, tuple(map(tuple, self.items)))


def _stage_run(mb: int, stage: int, region: Region, seq: int, cycles: float, items: tuple) -> StageRun:
    return StageRun(mb, stage, region, seq, cycles, tuple(map(Item._make, items)))


def flow_seconds(runs: Sequence[StageRun], last_stage: int, clock_hz: float, partial: bool = False) -> float:
    """When the last token of the decode that ran leaves, in seconds (see the module docstring). `partial`:
    the runs of an attempt that a fault ended (a dead tile's runs are lost): the stage runs whose chain is
    not all there are left out instead of raising."""
    return schedule_seconds(flow_schedule(runs, last_stage, clock_hz, partial))


def schedule_seconds(schedule: dict[tuple[int, int, int], tuple[Region, float, float]]) -> float:
    """When the last token of a :func:`flow_schedule` leaves, in seconds (0 for none)."""
    return max((end for _, _, end in schedule.values()), default=0.0)


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: a schedule makes ~10^5 small acyclic tuples (and the stage runs
    coming back from the tiles as many), and the collections they trigger walk every object of the process
    (60% of a schedule's time in a decode's process)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def flow_schedule(runs: Sequence[StageRun], last_stage: int, clock_hz: float, partial: bool = False
                  ) -> dict[tuple[int, int, int], tuple[Region, float, float]]:
    """Every token's stage run, (request, pos, stage) -> (region, start, end) in seconds: a discrete-event
    schedule in which every region serves the tokens waiting for it in the order they became ready (ties:
    the order its tile ran them), one at a time. A token's consecutive stages on one region (a group of
    layers) run back to back, as the tile runs its segment: one task, its stages one after another."""
    with no_gc():
        return _schedule(runs, last_stage, clock_hz, partial)


def _schedule(runs: Sequence[StageRun], last_stage: int, clock_hz: float, partial: bool
              ) -> dict[tuple[int, int, int], tuple[Region, float, float]]:
    lead = _leads(runs)
    last_stage = lead[last_stage] if last_stage in lead else last_stage
    regions: dict[Region, int] = {}  # every region as a small int (a Region hashes slowly)
    parts: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    tasks: dict[tuple[int, int, int], tuple[int, float, int]] = {}  # -> (region, cycles, seq)
    wants: dict[tuple[int, int], bool] = {}
    for r in runs:
        g, s = regions.setdefault(r.region, len(regions)), lead[r.stage]
        for it in r.items:
            key = (it.request, it.pos, s)
            _, alone, seq = tasks.get(key, (g, 0.0, r.seq))
            tasks[key] = (g, alone + it.alone, min(seq, r.seq))
            parts.setdefault(key, []).append((r.stage, it.alone))
            if r.stage == 0:
                wants[(it.request, it.pos)] = it.want
    deps = {t: _deps(*t, wants, last_stage, lead) for t in tasks}  # t: (request, pos, stage)
    waiting = {t: len(d) for t, d in deps.items()}
    after: dict[tuple, list] = {}
    for t, ds in deps.items():
        for d in ds:
            after.setdefault(d, []).append(t)
    ready: dict[int, list] = {}  # region -> heap of its ready tokens (ready at, seq, task)
    order: dict[int, int] = {}  # regions in the order they first had a token (ties go to the first)
    free: dict[int, float] = {}
    starts: list = []  # heap of (when a region can start its next token, its order, region); stale ones skipped

    def offer(t: tuple, when: float) -> None:
        region = tasks[t][0]
        heapq.heappush(ready.setdefault(region, []), (when, tasks[t][2], t))
        order.setdefault(region, len(order))
        heapq.heappush(starts, (max(free.get(region, 0.0), ready[region][0][0]), order[region], region))

    for t, n in waiting.items():
        if n == 0:
            offer(t, 0.0)
    done: dict[tuple, tuple[float, float]] = {}  # task -> (start, end) in cycles
    while starts:
        start, _, region = heapq.heappop(starts)
        q = ready[region]
        if not q or max(free.get(region, 0.0), q[0][0]) != start:
            continue  # stale: the region's next start changed since
        _, _, t = heapq.heappop(q)
        done[t] = (start, start + tasks[t][1])
        free[region] = done[t][1]
        if q:
            heapq.heappush(starts, (max(free[region], q[0][0]), order[region], region))
        for nxt in after.get(t, ()):
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                offer(nxt, max(done[d][1] for d in deps[nxt]))
    if len(done) != len(tasks) and not partial:
        raise ValueError("the stage runs do not form a pipeline: a token waits for one that never ran")
    out, named = {}, list(regions)
    for t, (a, _) in done.items():
        for stage, alone in sorted(parts[t]):
            out[(t[0], t[1], stage)] = (named[tasks[t][0]], a / clock_hz, (a + alone) / clock_hz)
            a += alone
    return out


def _leads(runs: Sequence[StageRun]) -> dict[int, int]:
    """Every stage -> the first stage of its run of consecutive stages on one region."""
    region = {r.stage: r.region for r in runs}
    lead: dict[int, int] = {}
    for s in sorted(region):
        lead[s] = lead[s - 1] if s - 1 in region and region[s - 1] == region[s] else s
    return lead


def _deps(request: int, pos: int, stage: int, wants: dict, last_stage: int, lead: dict[int, int]
          ) -> list[tuple[int, int, int]]:
    """The (request, pos, stage) tasks that the token (request, pos)'s task at `stage` waits for: its previous
    stage run; at the embedding, its request's previous token entering it and -- when that token's logits gave
    this one (`wants`) -- leaving the head. Plain tuples: a schedule makes ~10^5 of them (a named tuple made the
    schedule 10-25% slower)."""
    if stage:
        return [(request, pos, lead.get(stage - 1, stage - 1))]
    prev = (request, pos - 1)
    if prev not in wants:
        return []
    return list(dict.fromkeys([(*prev, 0)] + ([(*prev, last_stage)] if wants[prev] else [])))


def round_seconds(runs: Sequence[StageRun], last_stage: int, clock_hz: float) -> float:
    """The length of the last round of a decode that ran: flow_seconds of every token, less that of the
    tokens before each request's last one."""
    last = {}
    for r in runs:
        for it in r.items:
            last[it.request] = max(last.get(it.request, -1), it.pos)
    before = [StageRun(r.mb, r.stage, r.region, r.seq, r.cycles,
                       tuple(it for it in r.items if it.pos < last[it.request])) for r in runs]
    return flow_seconds(runs, last_stage, clock_hz) - flow_seconds(before, last_stage, clock_hz)


def requests_round_seconds(alone: Sequence[float], regions: Sequence[Region], requests: int, clock_hz: float,
                           rounds: int = 4) -> float:
    """The steady round of `requests` decoding at their own pace through stages that take `alone[s]`
    cycles per token on `regions[s]` (the embedding's and the head's are one): round by round, request by
    request; the embedding/head region takes a request's head run, then its next token's embedding."""
    last = len(regions) - 1

    def run(s: int, i: int, req: int, r: int) -> StageRun:
        return StageRun(0, s, regions[s], i, 0.0, (Item(req, r, True, alone[s]),))

    head = [(0, req, 0) for req in range(requests)]
    for r in range(rounds):
        for req in range(requests):
            head += [(last, req, r)] + ([(0, req, r + 1)] if r + 1 < rounds else [])
    runs = [run(s, i, req, r) for i, (s, req, r) in enumerate(head)]
    runs += [run(s, i, req, r) for s in range(1, last)
             for i, (r, req) in enumerate((r, req) for r in range(rounds) for req in range(requests))]
    return round_seconds(runs, last, clock_hz)


def round_bound_seconds(alone: Sequence[float], regions: Sequence[Region], requests: int, clock_hz: float) -> float:
    """A steady round of `requests` at their own pace lasts at least one token's way through every stage,
    and at least what the busiest region must serve of them (`requests` x its stages' cycles): the cycle
    time of a closed pipeline (requests_round_seconds schedules it; the planner skips what cannot win)."""
    load: dict[Region, float] = {}
    for cycles, region in zip(alone, regions):
        load[region] = load.get(region, 0.0) + cycles
    return max(sum(alone), requests * max(load.values(), default=0.0)) / clock_hz
