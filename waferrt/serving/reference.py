"""The same requests on the single-process numpy reference: the ground truth the wafer's tokens must equal.

Contract: :func:`generate_reference` runs each request in turn on :class:`~waferrt.model.ReferenceModel` (its prompt
token by token, then sampled tokens; dense or STAR's sparse attention), sampling request i with
``request_rng(sampler, i)``, and returns the completions and the run's stats (wall time, per-token latency).
:func:`generate_batched` runs the same requests together, as one plain process serves them best: every prompt
prefilled in one batch, then one batched step per token for all the requests still going (the weights read once per
step) -- the honest anchor for the wafer's throughput with several requests in flight.
"""

from __future__ import annotations

import time

from waferrt.model.config import LlamaConfig
from waferrt.model.reference import ReferenceModel
from waferrt.model.sampling import Sampler
from waferrt.model.sparse import DENSE, AttentionMode

from .requests import Completion, GenRequest, GenStats, OnToken, finish_reason, request_rng


def generate_reference(config: LlamaConfig, weights, requests: list[GenRequest], sampler: Sampler,
                       on_token: OnToken | None = None, attention: AttentionMode = DENSE
                       ) -> tuple[list[Completion], GenStats]:
    """The single-process numpy reference: each request prefilled with the decode step, then decoded, attending
    as `attention` says (dense, or STAR's sparse:K: the wafer's sparse tokens are its tokens)."""
    model, stats = ReferenceModel(config, weights, attention), GenStats()
    out = []
    t0 = time.perf_counter()
    for i, req in enumerate(requests):
        done, rng = Completion(req.prompt_ids), request_rng(sampler, i)
        cache = model.new_cache(capacity=len(req.prompt_ids) + req.max_new_tokens)
        for pos, tok in enumerate(req.prompt_ids):
            logits = model.step(tok, pos, cache)
        while not done.finish:
            t1 = time.perf_counter()
            token = sampler.sample(logits, rng)
            done.tokens.append(token)
            done.finish = finish_reason(req, done, token)
            if on_token:
                on_token(i, token, done.finish)
            if not done.finish:
                logits = model.step(token, cache.length, cache)
                stats.token_latency_s.append(time.perf_counter() - t1)
        stats.tokens += len(done.tokens)
        out.append(done)
    stats.wall_s = time.perf_counter() - t0
    return out, stats


def generate_batched(config: LlamaConfig, weights, requests: list[GenRequest], sampler: Sampler,
                     on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
    """The reference decoding all `requests` together (see the module docstring)."""
    model, stats = ReferenceModel(config, weights), GenStats()
    out = [Completion(r.prompt_ids) for r in requests]
    rngs = [request_rng(sampler, i) for i in range(len(requests))]
    t0 = time.perf_counter()
    caches = [model.new_cache(len(r.prompt_ids) + r.max_new_tokens) for r in requests]
    logits = [model.prefill(r.prompt_ids, c) for r, c in zip(requests, caches, strict=True)]
    live = list(range(len(requests)))
    while live:
        t1 = time.perf_counter()
        for i in live:
            token = sampler.sample(logits[i], rngs[i])
            out[i].tokens.append(token)
            out[i].finish = finish_reason(requests[i], out[i], token)
            if on_token:
                on_token(i, token, out[i].finish)
        live = [i for i in live if not out[i].finish]
        if live:
            got = model.step_batch([out[i].tokens[-1] for i in live], [caches[i].length for i in live],
                                   [caches[i] for i in live])
            for j, i in enumerate(live):
                logits[i] = got[j]
            stats.token_latency_s.append(time.perf_counter() - t1)
    stats.wall_s = time.perf_counter() - t0
    stats.tokens = sum(len(c.tokens) for c in out)
    return out, stats
