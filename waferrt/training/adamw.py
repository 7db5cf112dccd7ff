"""AdamW (decoupled weight decay), the optimizer of a training step, its state kept off the wafer.

Contract: :class:`AdamW` is the hyper-parameters (a frozen value, checked). :class:`Moments` holds the first
and second moments of one weight (float32, the weight's shape, zero at the start). ``adamw_update(w, g,
moments, step, hp)`` updates `w` and `moments` in place from the gradient `g` at optimizer step `step`
(1, 2, ...; bias-corrected), in float32 and in a fixed order of operations, so that the same weights,
gradients and step give the same bits wherever it runs (the host, the MemoryX actor). Weight decay applies
to matrices only (norm weights are not decayed, as nanoGPT does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AdamW:
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.lr < 1:
            raise ValueError(f"AdamW lr {self.lr} must lie in (0, 1), e.g. 3e-3")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"AdamW {name} {getattr(self, name)} must lie in [0, 1), e.g. 0.9")
        if self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"AdamW eps {self.eps} must be > 0 and weight_decay {self.weight_decay} >= 0")


@dataclass(frozen=True, eq=False)
class Moments:
    """AdamW's running moments of one weight: m (the gradient's mean), v (its square's), float32."""

    m: np.ndarray
    v: np.ndarray

    def __post_init__(self) -> None:
        if self.m.shape != self.v.shape or self.m.dtype != np.float32 or self.v.dtype != np.float32:
            raise ValueError(f"Moments m {self.m.dtype}{self.m.shape} and v {self.v.dtype}{self.v.shape} must be "
                             "float32 of the weight's shape; start them with Moments.zeros(w)")

    @classmethod
    def zeros(cls, w: np.ndarray) -> Moments:
        return cls(np.zeros(w.shape, np.float32), np.zeros(w.shape, np.float32))


def adamw_update(w: np.ndarray, g: np.ndarray, moments: Moments, step: int, hp: AdamW) -> None:
    """One AdamW step of weight w (float32, updated in place) with gradient g at optimizer step `step` >= 1."""
    if w.shape != g.shape or w.dtype != np.float32 or g.dtype != np.float32:
        raise ValueError(f"AdamW: weight {w.dtype}{w.shape} and gradient {g.dtype}{g.shape} must be float32 "
                         "of one shape")
    if step < 1:
        raise ValueError(f"AdamW step {step}: optimizer steps count from 1 (the bias correction divides by "
                         "1 - beta^step)")
    f32 = np.float32
    m, v = moments.m, moments.v
    m *= f32(hp.beta1)
    m += f32(1 - hp.beta1) * g
    v *= f32(hp.beta2)
    v += f32(1 - hp.beta2) * (g * g)
    m_hat = m / f32(1 - hp.beta1 ** step)
    v_hat = v / f32(1 - hp.beta2 ** step)
    if w.ndim > 1:
        w *= f32(1 - hp.lr * hp.weight_decay)
    w -= f32(hp.lr) * m_hat / (np.sqrt(v_hat) + f32(hp.eps))
