"""``waferrt generate --attention dense|sparse:K [--compare-dense]``: STAR's sparse attention on the wafer.

Contract: `add_attention_args` registers the two flags; `attention_mode` is --attention's argparse type (a
bad word is one line, exit 2, saying what to write). `check_attention_flags` refuses them with --reference
and, for sparse attention (the long contexts), a request whose prompt and new tokens need more K/V
positions than --kv-tokens, naming the flags to write (`check_kv_room`), before anything loads.
`dense_agreement` decodes the same requests densely on the numpy reference (the prompt prefilled in chunks,
then the same sampler and per-request RNG as the wafer; the wafer's dense tokens equal the reference's) and
compares the wafer's tokens with them: `Agreement` per request (tokens equal position by position, the first
that differs), printed by `say_agreement` and put in --json by `agreement_json`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from waferrt.model.sparse import AttentionMode

from .common import UsageError, say

PREFILL_CHUNK = 512  # the reference prefills a long prompt this many tokens at a time (bounds its memory)


def attention_mode(text: str) -> AttentionMode:
    """dense, sparse:K or sparse:F -> the AttentionMode (argparse's one-line error otherwise)."""
    try:
        return AttentionMode.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_attention_args(p) -> None:
    p.add_argument("--attention", type=attention_mode, default=AttentionMode(), metavar="MODE",
                   help="dense (default), or STAR's sparse attention in every decode step and in the MeshGEMM "
                        "prefill (--prefill): sparse:K keeps the K keys of highest predicted score per query head "
                        "(e.g. sparse:64), sparse:F a fraction of the context (e.g. sparse:0.25)")
    p.add_argument("--compare-dense", action="store_true",
                   help="also decode the prompts densely on the numpy reference and print how many of the "
                        "wafer's tokens equal dense's (json: dense_agreement)")


def check_attention_flags(args) -> None:
    """--compare-dense against the other flags: UsageError (--reference takes --attention: the reference
    attends sparsely too, and the wafer's sparse tokens are its tokens)."""
    if args.reference and args.compare_dense:
        raise UsageError("--compare-dense compares the wafer's tokens with the dense reference's; with --reference "
                         "run the two commands (--attention sparse:K and dense) and compare them, or leave out "
                         "--reference")


def check_kv_room(args, requests) -> None:
    """For sparse attention (long contexts): UsageError naming --kv-tokens (and --requests) to write when a
    request needs more K/V positions than --kv-tokens."""
    if args.attention.dense or args.reference:  # the reference holds any context
        return
    need = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
    if need > args.kv_tokens:
        raise UsageError(f"a request needs {need} K/V positions (its prompt and --max-new-tokens "
                         f"{args.max_new_tokens}) but --kv-tokens is {args.kv_tokens}: write --kv-tokens {need} "
                         f"--requests {len(requests)} (a long context fits the default mesh with few requests)")


@dataclass(frozen=True)
class Agreement:
    """One request's wafer tokens against dense's: `equal` of `compared` positions, `first_diff` or None."""

    equal: int
    compared: int
    first_diff: int | None

    def __post_init__(self) -> None:
        if not 0 <= self.equal <= self.compared:
            raise ValueError(f"Agreement: {self.equal} equal of {self.compared} compared tokens is not a share")

    @property
    def share(self) -> float:
        return self.equal / self.compared if self.compared else 1.0

    @classmethod
    def of(cls, got: list[int], dense: list[int]) -> Agreement:
        n = min(len(got), len(dense))
        same = [a == b for a, b in zip(got[:n], dense[:n], strict=True)]
        return cls(sum(same), n, None if all(same) and len(got) == len(dense) else
                   next((i for i, s in enumerate(same) if not s), n))


def dense_tokens(config, weights, request, sampler, rng) -> list[int]:
    """The tokens the dense reference decodes for `request` (prompt prefilled in PREFILL_CHUNK pieces)."""
    from waferrt.model.reference import ReferenceModel
    from waferrt.serving.requests import Completion, finish_reason

    model, done = ReferenceModel(config, weights), Completion(request.prompt_ids)
    cache = model.new_cache(capacity=len(request.prompt_ids) + request.max_new_tokens)
    ids = list(request.prompt_ids)
    for lo in range(0, len(ids), PREFILL_CHUNK):
        logits = model.prefill(ids[lo:lo + PREFILL_CHUNK], cache)
    while not done.finish:
        done.tokens.append(sampler.sample(logits, rng))
        done.finish = finish_reason(request, done, done.tokens[-1])
        if not done.finish:
            logits = model.step(done.tokens[-1], cache.length, cache)
    return done.tokens


def dense_agreement(config, weights, batch, completions) -> list[Agreement]:
    """Each request of `batch` (a serving Batch) decoded densely on the reference, against the wafer's tokens."""
    from waferrt.serving.requests import request_rng

    say("decoding the prompts densely on the numpy reference, to compare")
    return [Agreement.of(list(c.tokens), dense_tokens(config, weights, r, batch.sampler, request_rng(batch.sampler, i)))
            for i, (r, c) in enumerate(zip(batch.requests, completions, strict=True))]


def say_agreement(mode: AttentionMode, agreements: list[Agreement]) -> None:
    for i, a in enumerate(agreements):
        where = "" if a.first_diff is None else f"; first differs at generated token {a.first_diff}"
        say(f"request {i}: {mode} attention: {a.equal} of {a.compared} tokens equal dense's ({a.share:.0%}){where}")


def attention_json(args, agreements: list[Agreement] | None) -> dict:
    """--json's fields: the attention mode, and with --compare-dense each request's agreement with dense."""
    out: dict = {"attention": str(args.attention)}
    if agreements is not None:
        out["dense_agreement"] = [{"equal": a.equal, "compared": a.compared, "share": round(a.share, 4),
                                   "first_diff": a.first_diff} for a in agreements]
    return out
