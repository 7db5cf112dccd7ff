"""A load run's requests, drawn from a seed: when each is sent and what it asks (vLLM's random dataset).

Contract: :class:`Arrivals` (requests per second, ``inf`` for all at once; burstiness: the gamma shape, 1
for a Poisson process) gives :meth:`Arrivals.offsets`, when each of n requests is sent, seconds after the
first: the gaps are gamma-distributed with shape ``burstiness`` and scale ``1 / (rate * burstiness)`` (mean
``1 / rate``), as vLLM's ``get_request`` draws them. :class:`Lengths` (a mean and a range ratio r in [0, 1))
draws lengths uniformly from ``int(mean * (1 - r))`` to ``int(mean * (1 + r))`` inclusive, at least 1.
:func:`draw_requests` makes the prompts: each a run of token ids drawn uniformly from ``vocab`` (the
tokenizer's ordinary ids), with its own output length. Same seed, same requests; pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Arrivals:
    rate: float = math.inf  # requests per second; inf: every request at once
    burstiness: float = 1.0  # the gamma shape: 1 Poisson, < 1 burstier, > 1 steadier

    def __post_init__(self) -> None:
        if not self.rate > 0 or not math.isfinite(self.burstiness) or not self.burstiness > 0:
            raise ValueError(f"--request-rate is a positive number or inf, --burstiness a positive number, not "
                             f"{self.rate} and {self.burstiness} (e.g. --request-rate 2 --burstiness 1: Poisson)")

    def offsets(self, n: int, seed: int) -> np.ndarray:
        """When each of `n` requests is sent, in seconds after the first (which is sent at 0)."""
        if math.isinf(self.rate):
            return np.zeros(n)
        gaps = np.random.default_rng(seed).gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), n - 1)
        return np.concatenate([[0.0], np.cumsum(gaps)]) if n else np.zeros(0)


@dataclass(frozen=True)
class Lengths:
    mean: int
    range_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 1 or not 0 <= self.range_ratio < 1:
            raise ValueError(f"a length is a whole number >= 1 and --range-ratio in [0, 1), not {self.mean} and "
                             f"{self.range_ratio} (e.g. --input-len 32 --range-ratio 0.5: 16 to 48 tokens)")

    @property
    def bounds(self) -> tuple[int, int]:
        """The shortest and longest length drawn."""
        return max(1, int(self.mean * (1 - self.range_ratio))), max(1, int(self.mean * (1 + self.range_ratio)))

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        low, high = self.bounds
        return rng.integers(low, high + 1, n)


@dataclass(frozen=True)
class Drawn:
    """One request to send: its prompt as token ids and how many tokens it asks for."""

    prompt_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Shape:
    """What the requests look like: their prompts' and outputs' lengths, and the token ids prompts draw from."""

    input: Lengths
    output: Lengths
    vocab: range  # the tokenizer's ordinary ids (no special tokens)


def draw_requests(shape: Shape, n: int, seed: int) -> list[Drawn]:
    """`n` requests from `seed`: each prompt's length from ``shape.input``, its ids uniform over
    ``shape.vocab``; each output length from ``shape.output``."""
    if len(shape.vocab) < 1:
        raise ValueError("prompts draw their ids from a non-empty range of the tokenizer's ordinary ids")
    rng = np.random.default_rng([seed, 1])
    ins, outs = shape.input.draw(n, rng), shape.output.draw(n, rng)
    ids = [rng.integers(0, len(shape.vocab), k) for k in ins]
    return [Drawn(tuple(shape.vocab[j] for j in row), int(m)) for row, m in zip(ids, outs)]
