"""Requests resumed after a fault: what each unfinished request still has to do, as a new request.

Contract: :func:`resume` turns the requests of a decode and what they have produced so far into the
:class:`~waferrt.serving.engine.Submission` s that finish them: every request that has not ended comes back
with its prompt followed by the tokens it already produced (the K/V entries the fault took are
recomputed by running them again: replay), asks for the tokens it still lacks, and skips the RNG draws
of the tokens it has (``Submission.made``), so that it goes on exactly as it would have without the fault.
:func:`replayed_tokens` counts the positions a resume runs again. Pure.
"""

from __future__ import annotations

from dataclasses import replace

from waferrt.model.sampling import Sampler

from .engine import Submission
from .requests import Completion, GenRequest


def resume(requests: list[GenRequest], out: list[Completion], sampler: Sampler,
           keep_logits: bool = False) -> list[Submission]:
    subs = []
    for i, (req, done) in enumerate(zip(requests, out, strict=True)):
        if done.finish:
            continue
        made = len(done.tokens)
        again = replace(req, prompt_ids=tuple(req.prompt_ids) + tuple(done.tokens),
                        max_new_tokens=req.max_new_tokens - made)
        subs.append(Submission(i, again, sampler, keep_logits, made))
    return subs


def replayed_tokens(subs: list[Submission]) -> int:
    """Positions the resumed requests run again (their prompts and the tokens they had produced)."""
    return sum(len(s.request.prompt_ids) for s in subs)
