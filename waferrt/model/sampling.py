"""Sampler: turn a logits vector into the next token id, deterministically for a given seed.

Contract: `Sampler` is a frozen config. temperature == 0 is greedy argmax (ties go to the lowest id).
Otherwise the candidates are the top_k highest logits (all if top_k == 0), ordered by (logit desc, id asc);
their softmax at `temperature` is cut to the smallest prefix whose mass reaches top_p, renormalised, and one
is drawn with a single `rng.random()`. The probabilities are computed in float64 from the float32 logits, so
the draw does not depend on float32 summation order. The same seed and logits give the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        """A fresh generator for one request, seeded by `seed`."""
        return np.random.default_rng(self.seed)

    def skip(self, rng: np.random.Generator, tokens: int) -> None:
        """Advance rng past the draws of `tokens` sampled tokens (a request resumed after a fault draws on
        from where it was): one draw per token, none when greedy."""
        if not self.greedy and tokens:
            rng.random(tokens)

    def sample(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """The next token id for logits (vocab,). Greedy sampling does not touch rng."""
        if logits.ndim != 1:
            raise ValueError(f"logits must be one vector (vocab,), got shape {logits.shape}")
        if np.isnan(logits).any():
            raise ValueError("logits contain NaN: the model diverged; check the weights and dtypes")
        if self.greedy:
            return int(np.argmax(logits))
        ids = self._candidates(logits)  # (n,) best first
        z = logits[ids].astype(np.float64) / self.temperature
        p = np.exp(z - z[0])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1  # smallest prefix with mass >= top_p
            p = p[:keep] / p[:keep].sum()
            ids = ids[:keep]
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return int(ids[min(i, len(ids) - 1)])

    def _candidates(self, logits: np.ndarray) -> np.ndarray:
        """Candidate ids ordered by (logit descending, id ascending); the top_k of them if top_k > 0."""
        ids = np.arange(logits.shape[0])
        if 0 < self.top_k < logits.shape[0]:
            # Every id tied with the k-th logit stays in, so the cut does not depend on argpartition's order.
            kth = np.partition(logits, -self.top_k)[-self.top_k]
            ids = ids[logits >= kth]
        order = np.lexsort((ids, -logits[ids]))
        return ids[order][: self.top_k or None]
