"""The load client's numbers (waferrt.serving.stats, vLLM's formulas) and its requests (waferrt.serving.workload),
each pinned by figures worked out by hand."""

import math

import numpy as np
import pytest

from waferrt.serving.stats import Outcome, Slo, Spread, Timing, summarize
from waferrt.serving.workload import Arrivals, Lengths, Shape, draw_requests

# three requests that completed and one that failed, over a run of 2 s (times exact in binary)
A = Outcome(True, 10, 5, Timing(0.25, 1.25, (0.25,) * 4), Timing(0.001, 0.005, (0.001,) * 4))  # TPOT 1/4 s
B = Outcome(True, 6, 3, Timing(0.5, 1.25, (0.25, 0.5)), Timing(0.002, 0.004, (0.001, 0.001)))  # TPOT 0.75/2
C = Outcome(True, 4, 1, Timing(0.125, 0.125))  # one token: no TPOT, no gap; no modelled times
D = Outcome(False, error="HTTP 503")


def test_the_counts_and_throughputs_by_hand():
    s = summarize([A, B, C, D], 2.0)
    assert (s.completed, s.failed, s.errors) == (3, 1, ("HTTP 503",))
    assert (s.total_input_tokens, s.total_output_tokens) == (20, 9)
    assert (s.request_throughput, s.output_throughput, s.total_token_throughput) == (1.5, 4.5, 14.5)
    assert s.request_goodput is None  # no SLO asked


def test_ttft_tpot_itl_e2el_by_hand():
    w = summarize([A, B, C, D], 2.0).wall
    # TTFT 250, 500, 125 ms: sorted 125 250 500; p90 at rank 1.8 = 250 + 0.8 * 250
    assert w.ttft == Spread(pytest.approx(875 / 3), 250, pytest.approx(450), pytest.approx(495))
    # TPOT (1.25 - 0.25) / 4 = 250 ms and (1.25 - 0.5) / 2 = 375 ms; C's one token has none
    assert w.tpot == Spread(312.5, 312.5, pytest.approx(362.5), pytest.approx(373.75))
    # ITL pooled: 250 x5, 500; p90 at rank 4.5 = 250 + 0.5 * 250
    assert w.itl == Spread(pytest.approx(1750 / 6), 250, pytest.approx(375), pytest.approx(487.5))
    assert w.e2el == Spread(875, 1250, 1250, 1250)


def test_the_modelled_clock_is_summarized_over_the_requests_that_carried_it():
    m = summarize([A, B, C, D], 2.0).modelled
    assert m.ttft.mean_ms == pytest.approx(1.5) and m.e2el.median_ms == pytest.approx(4.5)
    assert m.tpot.mean_ms == pytest.approx(1.0) and m.itl.p99_ms == pytest.approx(1.0)
    assert summarize([C], 1.0).modelled is None
    assert summarize([C], 1.0).wall.itl is None  # no request had a gap


def test_goodput_counts_the_requests_meeting_every_slo():
    # A: TTFT 250 <= 250 and TPOT 250 <= 250 (equal meets); B: TTFT 500 misses; C: TTFT 125, TPOT counted 0
    assert summarize([A, B, C, D], 2.0, Slo.parse("ttft:250,tpot:250")).request_goodput == 1.0
    assert summarize([A, B, C, D], 2.0, Slo.parse("ttft:250,tpot:250,e2el:1000")).request_goodput == 0.5
    assert summarize([A, B, C, D], 2.0, Slo.parse("tpot:249")).request_goodput == 0.5  # only C (TPOT 0)


def test_no_request_completed_gives_zeros_not_an_error():
    s = summarize([D], 1.0)
    assert s.completed == 0 and s.wall.ttft == Spread(0, 0, 0, 0) and s.modelled is None


@pytest.mark.parametrize("text", ["ttft", "ttft:0", "ttft:x", "tbt:5", "ttft:5,ttft:6", "ttft:-1"])
def test_a_bad_slo_says_how_to_write_one(text):
    with pytest.raises(ValueError, match="ttft:500,tpot:50"):
        Slo.parse(text)


def test_a_timing_whose_first_token_comes_after_its_end_is_refused():
    with pytest.raises(ValueError, match="between 0 and its latency"):
        Timing(2.0, 1.0)


def test_arrivals_are_gamma_gaps_of_mean_one_over_the_rate():
    assert Arrivals().offsets(5, 0).tolist() == [0.0] * 5  # inf: all at once
    # rate 2, burstiness 4: gamma(shape 4, scale 1/8): mean 0.5 s, coefficient of variation 1/sqrt(4) = 0.5
    gaps = np.diff(Arrivals(2.0, 4.0).offsets(4001, seed=7))
    assert abs(gaps.mean() - 0.5) < 0.02 and abs(gaps.std() / gaps.mean() - 0.5) < 0.03
    poisson = np.diff(Arrivals(2.0).offsets(4001, seed=7))  # shape 1: exponential, CV 1
    assert abs(poisson.std() / poisson.mean() - 1.0) < 0.06
    assert Arrivals(2.0).offsets(10, 3).tolist() == Arrivals(2.0).offsets(10, 3).tolist()
    assert Arrivals(2.0).offsets(1, 3).tolist() == [0.0]


def test_lengths_are_uniform_within_the_range_ratio():
    assert Lengths(32, 0.5).bounds == (16, 48)
    assert Lengths(10, 0.25).bounds == (7, 12)  # int(7.5), int(12.5)
    assert Lengths(1, 0.9).bounds == (1, 1)
    drawn = Lengths(10, 0.25).draw(500, np.random.default_rng(0))
    assert set(drawn.tolist()) == set(range(7, 13))


@pytest.mark.parametrize("bad", [dict(rate=0.0), dict(rate=-1.0), dict(burstiness=0.0), dict(burstiness=math.inf)])
def test_bad_arrivals_say_what_to_write(bad):
    with pytest.raises(ValueError, match="--request-rate"):
        Arrivals(**bad)


def test_the_requests_are_drawn_from_the_seed_within_their_shape():
    shape = Shape(Lengths(8, 0.5), Lengths(4), range(100, 200))
    reqs = draw_requests(shape, 50, seed=1)
    assert reqs == draw_requests(shape, 50, seed=1) and reqs != draw_requests(shape, 50, seed=2)
    assert {len(r.prompt_ids) for r in reqs} <= set(range(4, 13)) and {r.max_tokens for r in reqs} == {4}
    assert all(100 <= t < 200 for r in reqs for t in r.prompt_ids)
