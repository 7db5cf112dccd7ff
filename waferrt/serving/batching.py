"""Continuous batching: requests enter free K/V slots as others finish, every step pushes each live
request's next tokens through the decode, and the host samples.

Contract: :func:`continuous_batching(step, placement, requests, sampler, on_token)` drives any decode
``step(items, resets) -> (logits by item, modelled seconds)``: the wafer's (WaferLLM) or the in-process
one (LocalDecoder). Admission is the scheduler's (``waferrt.scheduler.admission``): a request the K/V
capacity cannot hold is refused with the reason before it starts. Items are ``(slot, token, pos,
want_logits)``; a request's first step carries its whole prompt. Request i samples with
``request_rng(sampler, i)``, so the tokens equal the reference's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from waferrt.model.sampling import Sampler
from waferrt.scheduler.admission import Admission, Request

from .requests import Completion, GenRequest, GenStats, OnToken, finish_reason, request_rng


@dataclass
class _Live:
    index: int
    req: GenRequest
    slot: int
    rng: np.random.Generator
    done: Completion
    pos: int = 0
    feed: tuple[int, ...] = ()  # tokens to push through the pipeline next step


def continuous_batching(step, placement, requests: list[GenRequest], sampler: Sampler,
                        on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
    """Requests enter free KV slots as others finish (the scheduler's admission); every step pushes each
    live request's next tokens (its whole prompt, first) through `step(items, resets)`."""
    adm = Admission(placement.kv_tokens, placement.kv.requests)
    out = [Completion(r.prompt_ids) for r in requests]
    for i, r in enumerate(requests):
        refusal = adm.submit(Request(i, len(r.prompt_ids), r.max_new_tokens, frozenset(r.stop_ids)))
        if refusal:
            out[i].finish = f"refused: {refusal.reason}"
    free, live, resets, stats = list(range(placement.kv.requests)), {}, [], GenStats()
    t0 = time.perf_counter()
    while True:
        for a in adm.admit():
            live[a.rid] = _Live(a.rid, requests[a.rid], free.pop(0), request_rng(sampler, a.rid), out[a.rid],
                                feed=requests[a.rid].prompt_ids)
        if not live:
            break
        items, owners = _items(live.values())
        t1 = time.perf_counter()
        logits, secs = step(items, resets)
        stats.steps, stats.modelled_s = stats.steps + 1, stats.modelled_s + secs
        if len(items) == len(live):  # a decode-only step: every request's next token
            stats.token_latency_s.append(time.perf_counter() - t1)
        resets = []
        for lv in _sample(owners, logits, sampler, on_token):  # the requests that just finished
            adm.finish(lv.index)
            free.append(lv.slot)
            resets.append(lv.slot)
            del live[lv.index]
    stats.wall_s = time.perf_counter() - t0
    stats.tokens = sum(len(c.tokens) for c in out)
    return out, stats


def _items(live) -> tuple[list, list]:
    """The step's items (slot, token, pos, want_logits): each live request's tokens to feed; and, per item,
    the request whose next token its logits give (None for the inner tokens of a prompt)."""
    items, owners = [], []
    for lv in live:
        for j, tok in enumerate(lv.feed):
            last = j == len(lv.feed) - 1
            items.append((lv.slot, tok, lv.pos + j, last))
            owners.append(lv if last else None)
    return items, owners


def _sample(owners, logits: dict, sampler: Sampler, on_token) -> list:
    """Sample each request's next token from its logits; returns the requests that are done."""
    done = []
    for i, lv in enumerate(owners):
        if lv is None:
            continue
        lv.pos += len(lv.feed)
        token = sampler.sample(logits[i], lv.rng)
        lv.done.tokens.append(token)
        lv.feed = (token,)
        lv.done.finish = finish_reason(lv.req, lv.done, token)
        if on_token:
            on_token(lv.index, token, lv.done.finish)
        if lv.done.finish:
            done.append(lv)
    return done
