"""A request's arithmetic does not depend on the requests beside it (waferrt.decode.net): its rows of every
matrix product, and its attention, are bit for bit the same alone and in any micro-batch -- what makes a served
request's tokens equal to the same request decoded alone. On SmolLM2's real layer and head
(benchmarks/row_independence.py, one layer; skipped without the model), and matmul_rows at SmolLM2's shapes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from waferrt.decode.net import POSITION_BLOCK, ROW_GROUP, matmul_rows, whole_blocks

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("row_independence", ROOT / "benchmarks/row_independence.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (3072, 576)], ids=str)
def test_a_row_of_matmul_rows_is_the_same_alone_and_at_every_place_of_any_batch(shape):
    rng = np.random.default_rng(1)
    w = rng.standard_normal(shape, dtype=np.float32)
    x = rng.standard_normal((40, shape[1]), dtype=np.float32)
    alone = matmul_rows(w, x[:1])[0]
    for batch in (2, 3, ROW_GROUP, ROW_GROUP + 1, 11, 19, 33):
        for place in range(batch):
            rows = np.concatenate([x[1:1 + place], x[:1], x[1 + place:batch]])
            assert np.array_equal(matmul_rows(w, rows)[place], alone), (batch, place)
    np.testing.assert_allclose(alone, w.astype(np.float64) @ x[0], rtol=1e-4, atol=1e-4)


def test_whole_blocks_rounds_up_to_the_position_block():
    assert POSITION_BLOCK == 32
    assert [whole_blocks(n) for n in (1, 32, 33, 100, 522)] == [32, 32, 64, 128, 544]


def test_a_request_on_smollm2_is_bit_identical_alone_and_among_others(smollm2_cut):
    """A 100-token prompt and 4 decode steps, alone, then among a 300-token prompt and others in other slots,
    its prompt cut in two: every row of the layer's output and of the logits is the same (before the fix, with
    the old matmul_rows: all 104 rows differed by up to 3e-5 in the logits)."""
    config, weights = smollm2_cut(1)
    rows = _script().compare(config, weights, layers=1)
    assert [r[:3] for r in rows] == [("layer 0", 0, 104), ("logits", 0, 104)], rows
