"""One SmolLM2 training step with its layers' forward and backward and its head's as mesh kernels (waferrt.training
.mesh_phases) on 32x32 WSE-2 cores, without Ray: the gradients equal the numpy reference's
(model.backward.loss_and_grads) within 1e-4 relative to each weight's largest, for one sequence of 16 tokens
and for two of 8 (the attention per sequence). The whole 49,152-word head runs in chunks of the vocabulary (its
table does not fit the cores' SRAM whole); to stay well under a minute the model is SmolLM2-135M cut to its
first layer (the real weights, tokenizer-free ids). Skipped when SmolLM2 is not installed."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.gemm_cost import GemmShape
from waferrt.core.spec import spec_by_name
from waferrt.core.train_cost import head_chunks
from waferrt.model.backward import loss_and_grads
from waferrt.runtime import Wafer
from waferrt.training.mesh import mesh_phases
from waferrt.training.step import train_step
from waferrt.training.store import ParamStore

SIDE, S = 32, 16  # 16 tokens a step: one sequence, or two of 8 (attention per sequence)


@pytest.fixture(scope="module")
def smollm2(smollm2_cut):
    return smollm2_cut(1)


@pytest.mark.parametrize("batch", [1, 2], ids=["one-sequence", "two-sequences"])
def test_a_smollm2_step_on_the_mesh_has_the_references_gradients(smollm2, batch):
    config, weights = smollm2
    assert head_chunks(spec_by_name("wse2"), GemmShape(S, config.vocab_size, config.dim, SIDE, SIDE)) > 1
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (batch, S // batch + 1))
    store = ParamStore(config, weights)  # copies the weights: `weights` stay the step's
    with Wafer(spec="wse2", mesh=(SIDE, SIDE), tile=(SIDE, SIDE), backend="local") as wafer:
        report = train_step(store, tokens, 1, mesh_phases(wafer))
    loss, want = loss_and_grads(config, weights, tokens)
    assert report.loss == pytest.approx(loss, rel=1e-5)
    got = store.last_grads
    assert set(got) == set(want)
    for name, g in want.items():
        assert np.abs(got[name] - g).max() <= 1e-4 * np.abs(g).max(), name
