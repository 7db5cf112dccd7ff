"""Sampler: greedy, top-k, top-p, seeded determinism, float32 safety."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.model import Sampler

LOGITS = np.log(np.array([0.05, 0.5, 0.15, 0.3], dtype=np.float32))  # sorted ids by prob: 1, 3, 2, 0


def draws(sampler: Sampler, logits: np.ndarray, n: int) -> list[int]:
    rng = sampler.rng()
    return [sampler.sample(logits, rng) for _ in range(n)]


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    assert Sampler().sample(LOGITS, np.random.default_rng()) == 1
    assert Sampler().sample(np.array([0, 3, 3, 1], dtype=np.float32), np.random.default_rng()) == 1


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    s = Sampler(temperature=1.0, seed=7)
    assert draws(s, LOGITS, 50) == draws(s, LOGITS, 50)
    assert draws(s, LOGITS, 50) != draws(Sampler(temperature=1.0, seed=8), LOGITS, 50)


def test_frequencies_follow_softmax_at_temperature() -> None:
    got = np.bincount(draws(Sampler(temperature=1.0, seed=0), LOGITS, 4000), minlength=4) / 4000
    np.testing.assert_allclose(got, np.exp(LOGITS) / np.exp(LOGITS).sum(), atol=0.03)
    hot = np.bincount(draws(Sampler(temperature=100.0, seed=0), LOGITS, 4000), minlength=4) / 4000
    np.testing.assert_allclose(hot, 0.25, atol=0.03)


def test_top_k_keeps_only_the_k_best() -> None:
    assert set(draws(Sampler(temperature=5.0, top_k=2, seed=0), LOGITS, 300)) == {1, 3}
    assert set(draws(Sampler(temperature=5.0, top_k=1, seed=0), LOGITS, 50)) == {1}


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    assert set(draws(Sampler(temperature=1.0, top_p=0.75, seed=0), LOGITS, 300)) == {1, 3}
    assert set(draws(Sampler(temperature=1.0, top_p=0.8001, seed=0), LOGITS, 500)) == {1, 3, 2}
    assert set(draws(Sampler(temperature=1.0, top_p=0.01, seed=0), LOGITS, 50)) == {1}


def test_extreme_float32_logits_are_safe() -> None:
    logits = np.full(1000, -np.inf, dtype=np.float32)
    logits[[10, 20]] = [3e38, 3e38 - 1e32]
    assert set(draws(Sampler(temperature=1.0, seed=0), logits, 100)) <= {10, 20}
    with pytest.raises(ValueError, match="NaN"):
        Sampler(temperature=1.0).sample(np.array([0.0, np.nan], dtype=np.float32), np.random.default_rng())


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_invalid_settings_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Sampler(**kwargs)
