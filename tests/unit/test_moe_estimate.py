"""Mixtures of experts on paper: the named MoE shapes, the MoE figures of an estimate (experts per region,
the all-to-all's share of a token's time, what would fit) and `waferrt estimate --model mixtral-8x7b`."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest

from waferrt.cli import main
from waferrt.core.mesh import Extent
from waferrt.core.spec import TINY
from waferrt.estimator.advice import fits, model_bytes
from waferrt.estimator.estimate import estimate
from waferrt.estimator.moe_estimate import moe_estimate
from waferrt.model import tiny_moe_config
from waferrt.model.zoo import MODELS
from waferrt.scheduler.types import KVReserve


def test_the_named_moe_shapes_are_their_config_json():
    mixtral, qwen, deepseek = (MODELS[n] for n in ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite-like"))
    assert (mixtral.config.n_experts, mixtral.config.top_k, mixtral.config.hidden_dim) == (8, 2, 14336)
    assert round(mixtral.config.params() / 1e9, 1) == 46.7  # Mixtral-8x7B's published 46.7 B parameters
    assert round(mixtral.config.n_layers * mixtral.config.layer_params(active=True) / 1e9, 1) == 12.6
    assert (qwen.config.n_experts, qwen.config.top_k, qwen.config.shared_hidden_dim) == (60, 4, 5632)
    assert (deepseek.config.n_experts, deepseek.config.top_k) == (64, 6) and "LIKE it" in deepseek.note
    assert all("config.json" in m.source for m in (mixtral, qwen, deepseek))


def test_a_fitting_moe_gets_its_experts_per_region_and_all_to_all():
    config = tiny_moe_config(n_experts=4, top_k=2)
    est = dataclasses.replace(estimate(config, TINY, Extent(64, 64), KVReserve(64, 2), "float32"), label="tiny-moe")
    assert est.fits and est.breakdown_s["alltoall"] > 0
    moe = moe_estimate(est)
    er, naive = moe.mappings["er"], moe.mappings["naive"]
    assert er.grid[0] == 1
    assert er.grid[0] * er.grid[1] * er.grid[2] == 4 == naive.grid[0] * naive.grid[1] * naive.grid[2]
    assert 0 < er.share < 1 and 0 < naive.share < 1 and er.alltoall_s <= naive.alltoall_s
    assert er.cold_share >= naive.cold_share and moe.wafers == 0
    assert "mapping er" in moe.text() and json.dumps(moe.to_json())


def test_mixtral_does_not_fit_one_wafer_and_says_how_many_would_hold_it(capsys):
    t0 = time.perf_counter()
    assert main(["estimate", "--model", "mixtral-8x7b"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "experts         8 per layer of width 14336, top-2" in out
    assert "what would fit  8 wafers with the experts split among them (1 experts of every layer on each" in out
    needed = re.search(r"weights ([\d.]+) GB \+ K/V", out).group(1)
    assert f"of {needed} GB of weights" in out  # one weight total: the estimate's (advice.model_bytes)
    assert time.perf_counter() - t0 < 120  # closed forms: seconds, even loaded


@pytest.mark.parametrize("mesh", [Extent(4, 4), Extent(8, 8)])
def test_what_would_fit_is_the_estimators_own_floor_plan_test(mesh):
    """The wafers an MoE estimate names are those the estimator's floor plans accept (advice.fits), never a
    sum of bytes: each holds E/n experts of every layer, and no fewer wafers would do."""
    config, kv = tiny_moe_config(n_experts=8, top_k=2), KVReserve(64, 2)
    est = estimate(config, TINY, mesh, kv, "float32")
    moe = moe_estimate(est)
    assert not est.fits and moe.weight_bytes == model_bytes(config, kv, "float32")[0]
    for n in (2, 4, 8):
        share = dataclasses.replace(config, n_experts=8 // n, top_k=min(2, 8 // n))
        assert fits(share, TINY, mesh, kv, "float32", None) == (moe.wafers != 0 and n >= moe.wafers)
    assert ("what would fit  no split" in moe.text()) == (moe.wafers == 0)
