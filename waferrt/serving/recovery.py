"""Requests resumed after a fault: what each unfinished request still has to do, as a new request.

Contract: :func:`resume` turns the requests of a decode and what they have produced so far into the
:class:`~waferrt.serving.engine.Submission` s that finish them: every request that has not ended comes back
with its prompt followed by the tokens it already produced (the K/V entries the fault took are
recomputed by running them again: replay), asks for the tokens it still lacks, and skips the RNG draws
of the tokens it has (``Submission.made``), so that it goes on exactly as it would have without the fault.
:func:`resumed` is one request's (a server's: waferrt.server.runner). :func:`replayed_tokens` counts the
positions a resume runs again. Pure.
"""

from __future__ import annotations

from dataclasses import replace

from waferrt.model.sampling import Sampler

from .engine import Submission
from .requests import Completion, GenRequest


def resume(requests: list[GenRequest], out: list[Completion], sampler: Sampler,
           keep_logits: bool = False) -> list[Submission]:
    return [resumed(Submission(i, req, sampler, keep_logits), done.tokens)
            for i, (req, done) in enumerate(zip(requests, out, strict=True)) if not done.finish]


def resumed(sub: Submission, tokens: list[int]) -> Submission:
    """Submission `sub` again after it produced `tokens`: its prompt followed by them (replayed), the tokens
    it still lacks asked for, the RNG draws of those it has skipped."""
    req = sub.request
    again = replace(req, prompt_ids=tuple(req.prompt_ids) + tuple(tokens),
                    max_new_tokens=req.max_new_tokens - len(tokens))
    return replace(sub, request=again, made=sub.made + len(tokens))


def replayed_tokens(subs: list[Submission]) -> int:
    """Positions the resumed requests run again (their prompts and the tokens they had produced)."""
    return sum(len(s.request.prompt_ids) for s in subs)
