"""STAR's distributed top-K (waferrt.decode.topk) on the loop fabric: numpy's answer, and its closed form."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.cost import Cost, on_lines
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.decode.topk import TopKRow, row_topk, select_comparisons, topk_cost, unpack
from waferrt.fabric.loop import simulate
from waferrt.model.sparse import select_top

# (cores in the row, tile width, candidates per core, heads, keep): odd and even rows, keep below, at and
# above a core's share, a row in one tile and across several
ROWS = [(1, 1, 8, 2, 4), (2, 1, 8, 2, 4), (5, 2, 6, 3, 10), (6, 4, 4, 2, 16), (7, 3, 5, 1, 3), (8, 3, 16, 2, 64)]


def run(n: int, tile_w: int, m: int, heads: int, keep: int, rows: int = 2):
    mesh = MeshSpec(n, rows, tile_w, 2)
    scores = np.random.default_rng(n * 100 + m).standard_normal((rows, n, heads, m)).astype(np.float32)
    out, cost = simulate(mesh, TINY, mesh.region, lambda ctx, scores: row_topk(ctx, scores, keep), scores=scores)
    return scores, out, cost


@pytest.mark.parametrize(("n", "tile_w", "m", "heads", "keep"), ROWS)
def test_every_core_ends_with_numpys_top_k_of_its_row(n: int, tile_w: int, m: int, heads: int, keep: int) -> None:
    scores, out, _ = run(n, tile_w, m, heads, keep)
    got_scores, got = unpack(out)  # (rows, n, heads, keep) each
    for r in range(scores.shape[0]):
        row = scores[r].transpose(1, 0, 2).reshape(heads, n * m)  # (heads, positions): core j holds j*m..
        want = select_top(row, keep)  # (heads, keep)
        for j in range(n):
            np.testing.assert_array_equal(got[r, j], want)
            np.testing.assert_array_equal(got_scores[r, j], np.take_along_axis(row, want, -1))


@pytest.mark.parametrize(("n", "tile_w", "m", "heads", "keep"), ROWS)
def test_what_the_kernel_books_is_its_closed_form(n: int, tile_w: int, m: int, heads: int, keep: int) -> None:
    rows = 2
    _, _, booked = run(n, tile_w, m, heads, keep, rows)
    closed = {k: on_lines(c, rows) for k, c in topk_cost(TINY, TopKRow(n, m, heads, keep)).items()}
    for name in closed:
        assert booked.get(name, Cost()) == closed[name], name


def test_the_closed_form_by_hand() -> None:
    """7 cores, 5 candidates each, 1 head, keep 3 on TINY (alpha 1, beta 8, link 4 B/cycle, 2 flop/cycle):
    the selection sifts 5 candidates through a heap of 3 (2 levels): 10 comparisons = 5 cycles; 3 streamed
    rounds (middle core 3) of one hop and one stage, 9 cycles each, then the 24-byte lists of the two chains
    serialised once each at the middle, 2 x 6 cycles, and merged there, 2 x 3 comparisons = 3 cycles; 6
    senders; the multicast from the middle 3 hops: 3 + 8 + 6 = 17 cycles."""
    cost = topk_cost(TINY, TopKRow(cores=7, per_core=5, heads=1, keep=3))
    assert select_comparisons(5, 3) == 10 and select_comparisons(5, 9) == 15 and select_comparisons(1, 4) == 0
    assert cost["topk.select"] == Cost(flops=10, cycles=5.0)
    assert cost["topk.merge"] == Cost(hops=3, stages=3, link_bytes=144, messages=6, flops=6, cycles=42.0)
    assert cost["broadcast"] == Cost(hops=3, stages=1, link_bytes=144, messages=6, cycles=17.0)


def test_the_streamed_merge_grows_with_the_rounds_not_with_rounds_times_the_message() -> None:
    """Doubling the row adds rounds of a hop and a stage; the K entries are still serialised twice."""
    small, big = (topk_cost(TINY, TopKRow(n, 64, 9, 64))["topk.merge"] for n in (16, 32))
    message, merge = 9 * 64 * 8 / TINY.link_bytes_per_cycle, 2 * 9 * 64 / TINY.flops_per_cycle
    per_round = TINY.alpha_cycles + TINY.beta_cycles
    assert big.cycles - small.cycles == 8 * per_round
    assert small.cycles == 8 * per_round + 2 * message + merge


def test_keeping_more_than_the_row_holds_says_so() -> None:
    with pytest.raises(ValueError, match="keep at most"):
        TopKRow(cores=2, per_core=4, heads=1, keep=9)


def test_a_layers_sparse_attention_is_prediction_top_k_and_dense_over_the_kept_keys() -> None:
    from dataclasses import replace

    from waferrt.core.mesh import Region
    from waferrt.decode.cost import PREDICT_DTYPE, attention_parts
    from waferrt.decode.decoding import Decoding
    from waferrt.model import SMOLLM2_135M, AttentionMode

    dec, region = Decoding(SMOLLM2_135M), Region(0, 0, 8, 4)
    dense = attention_parts(TINY, dec, region, 512)
    assert attention_parts(TINY, replace(dec, attention=AttentionMode(keep=512)), region, 512) == dense
    sparse = attention_parts(TINY, replace(dec, attention=AttentionMode(keep=32)), region, 512)
    # up to 32 kept keys on the busiest core: its scores are those of 8 columns x 32 positions, densely
    assert sparse["scores"] == attention_parts(TINY, dec, region, 256)["scores"]
    assert sparse["softmax"].cycles < dense["softmax"].cycles
    # 9 heads x 64 head dims / 4 rows x 64 positions a column: 2 x 9 x 16 x 64 = 18,432 flops at the 16-bit rate
    assert sparse["predict"].flops == 18_432 and PREDICT_DTYPE == "float16"
    assert sparse["predict.reduce"] == dense["scores.reduce"]
    assert sparse["topk.merge"].messages + sparse["broadcast"].messages == 4 * 7 * 2  # 7 senders a row, 4 rows
