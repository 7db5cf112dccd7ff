"""Generation requests and what comes back: the values the serving loops (wafer, local, reference) share.

Contract: :class:`GenRequest` is frozen (prompt ids, max new tokens, stop ids); :class:`Completion` is one
request's outcome (tokens, finish reason); :class:`GenStats` the run's wall and modelled time. Request i
samples with :func:`request_rng` (``numpy.random.default_rng([seed, i])``) in every loop, so the wafer and
the reference give the same tokens; :func:`finish_reason` says when a request is done;
:func:`logit_positions` the positions a run's generated tokens came from (what its bound is taken at).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from waferrt.model.sampling import Sampler

OnToken = Callable[[int, int, str], None]  # (request index, token id, finish reason: "" while it goes on)


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Batch:
    """What one decode serves: the requests (request i samples with ``default_rng([sampler.seed, i])``), how
    every token is sampled, and whether each token's logits are kept (``Completion.logits``)."""

    requests: tuple[GenRequest, ...]
    sampler: Sampler
    keep_logits: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple) or not all(isinstance(r, GenRequest) for r in self.requests):
            raise TypeError(f"a Batch's requests are a tuple of GenRequest, not {type(self.requests).__name__}; "
                            "write Batch(tuple(requests), sampler)")


@dataclass
class Completion:
    prompt_ids: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    finish: str = ""  # "stop" (a stop token), "length" (max_new_tokens) or "refused: <reason>"
    logits: list = field(default_factory=list)  # what each token was sampled from, when kept


@dataclass
class GenStats:
    wall_s: float = 0.0
    modelled_s: float = 0.0  # what the steps would take on the modelled wafer
    steps: int = 0
    tokens: int = 0  # generated tokens
    token_latency_s: list[float] = field(default_factory=list)  # wall time of each decode-only step
    runs: list = field(default_factory=list)  # every StageRun the tiles booked (waferrt.decode.schedule)
    faults: list = field(default_factory=list)  # waferrt.faults.events.FaultEvent of every fault armed
    trace: object = None  # the run's waferrt.serving.trace.DecodeTrace, when one was asked for
    started: float = 0.0  # time.perf_counter() when the run started (for the wall times to first token)
    ttft_wall_s: dict = field(default_factory=dict)  # request index -> wall seconds to its first token
    ttft_modelled_s: dict = field(default_factory=dict)  # request index -> when its first token leaves the wafer
    expert_swaps: int | None = None  # with NI-Balancer on (generate --balance): the swaps of experts it finished

    @property
    def wall_tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def wafer_tokens_per_s(self) -> float:
        return self.tokens / self.modelled_s if self.modelled_s else 0.0

    def prefill_tokens_per_s(self, prompts: dict) -> dict:
        """request index -> its prompt's tokens over its modelled time to first token (`prompts`: index ->
        prompt length)."""
        return {i: prompts[i] / s for i, s in self.ttft_modelled_s.items() if s > 0}


def request_rng(sampler: Sampler, i: int) -> np.random.Generator:
    """The RNG of request i: the same in every serving loop, so seeded sampling gives the same tokens."""
    return np.random.default_rng([sampler.seed, i])


def logit_positions(out: list[Completion]) -> range:
    """The positions whose logits gave the generated tokens of `out` (a request of P prompt tokens that
    generated N: P-1 to P+N-2), from the shortest context any of them held to the longest; empty when none
    generated anything."""
    spans = [(len(c.prompt_ids) - 1, len(c.prompt_ids) + len(c.tokens) - 1) for c in out if c.tokens]
    return range(min((a for a, _ in spans), default=0), max((b for _, b in spans), default=0))


def most_items(out: list[Completion]) -> int:
    """The most tokens one micro-batch of `out`'s decode can carry: every request's prompt together (the last
    prompt token's logits give its first token) or its next token -- the tokens that may share an MoE layer's
    routed work (scheduler.speed.run_bound_tokens_per_s)."""
    return sum(max(len(c.prompt_ids), 1) for c in out)


def finish_reason(req: GenRequest, done: Completion, token: int) -> str:
    """Why the request is done after `token` ("stop", "length"), or "" while it goes on."""
    if token in req.stop_ids:
        return "stop"
    return "length" if len(done.tokens) >= req.max_new_tokens else ""
