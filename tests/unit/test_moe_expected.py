"""The estimator's MoE token is the expected routing, not a zero router's (decode.decoding.Routing.EXPECTED): its
experts the busiest block averaged over uniformly routed micro-batches, its all-to-all a token's expected
traffic per link times the micro-batch (no Ray); ``routed_parts`` prices a routing as the MoE layer books it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.cost import Cost, mean
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding, Routing
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.moe import MoELayerShard, pack_moe_layer
from waferrt.decode.pack import Chunks
from waferrt.decode.routed_cost import ROUTING_SAMPLE, moe_parts, routed_parts, uniform_routing
from waferrt.estimator.estimate import paper_decoding
from waferrt.model import synthetic_llama, tiny_moe_config

CFG = tiny_moe_config(n_experts=4, top_k=2)  # dim 64, experts of width 32
EXPECTED = Decoding(CFG, routing=Routing.EXPECTED)
ONE_EXPERT = 6_224  # cycles of one expert's SwiGLU for one token on one core: 12,448 flops at 2 a cycle


def test_mean_of_costs_by_hand():
    a, b = Cost(hops=2, stages=1, link_bytes=10, messages=4, flops=6, cycles=30.0), Cost(hops=4, cycles=10.0)
    assert mean([a, b]) == Cost(hops=3, stages=0.5, link_bytes=5, messages=2, flops=3, cycles=20.0)
    assert mean([a]) is a  # one sample stays as it is (whole numbers)


def test_uniform_routing_picks_top_k_distinct_experts_seeded():
    chosen = uniform_routing(CFG, 64)
    assert chosen.shape == (64, 2) and (chosen[:, 0] != chosen[:, 1]).all()
    assert np.array_equal(chosen, uniform_routing(CFG, 64)) and len({tuple(sorted(c)) for c in chosen}) == 6


def test_the_expected_token_worked_out_by_hand():
    """The 1x2 region, ER: band 0 holds experts 0 and 1, band 1 experts 2 and 3 (one core each: an expert is its
    compute alone, 6,224 cycles a token). A token whose two experts share a band makes that band run both
    (12,448 cycles), any other pair one each (6,224). ER's dispatch needs no hop; the combine of a token sends
    its 64 float32 (256 bytes) over the one link between the bands each way its experts need: one routing
    stage of 1 hop (alpha 1) + beta 8 + 256 / 4 = 73 cycles. For micro-batches of one token the expected
    parts are the mean over the ROUTING_SAMPLE tokens; for micro-batches of two, over their pairs: the busier
    band's expert runs, and the combine's busier link (256 bytes for each token whose experts it carries)."""
    region, n = Region(0, 0, 1, 2), ROUTING_SAMPLE
    bands = [{int(e) // 2 for e in token} for token in uniform_routing(CFG, n)]
    ones = {name: c.cycles for name, _, c in moe_parts(TINY, EXPECTED, region, 1)}
    assert ones["experts"] == pytest.approx(sum(3 - len(b) for b in bands) * ONE_EXPERT / n)
    assert ones["dispatch"] == 0 and ones["combine"] == 73
    chosen = uniform_routing(CFG, n).reshape(n // 2, 2, 2)
    runs = [max(np.bincount(pair.ravel() // 2, minlength=2)) for pair in chosen]  # the busier band's expert runs
    busier = [max(sum(0 in {int(e) // 2 for e in t} for t in pair), sum(1 in {int(e) // 2 for e in t} for t in pair))
              for pair in chosen]  # tokens over the busier link (south: band 0's, north: band 1's)
    twos = {name: c.cycles for name, _, c in moe_parts(TINY, EXPECTED, region, 2)}
    assert twos["experts"] == pytest.approx(sum(runs) * ONE_EXPERT / len(runs))
    assert twos["combine"] == pytest.approx(sum(9 + 64 * k for k in busier) / len(busier))
    first = {name: c.cycles for name, _, c in moe_parts(TINY, Decoding(CFG), region, 1)}
    assert first["experts"] == 2 * ONE_EXPERT  # the zero router's token: both experts on band 0


@pytest.mark.parametrize("mapping", ["er", "naive"])
def test_routed_parts_is_what_the_layer_booked(mapping):
    """One token through an MoE layer with a trained-like (random) router: what decode.moe.MoEStep booked for
    its experts, dispatch and combine is routed_parts of the experts it chose (read off the histogram)."""
    region = Region(0, 0, 4, 4)
    lw = synthetic_llama(CFG, seed=5).layers[0]
    shard = MoELayerShard(Decoding(CFG, experts=mapping), region, pack_moe_layer(CFG, lw, region, mapping),
                          KVCapacity(1, 8), Ledger(TINY))
    x = np.random.default_rng(1).standard_normal((1, CFG.dim)).astype(np.float32)
    shard.forward(Chunks(CFG.dim, region.w).split(x), np.arange(1), np.full(1, 0))
    chosen = np.nonzero(shard.routed)[0][None]
    assert chosen.shape == (1, 2)
    experts, dispatch, combine = routed_parts(TINY, Decoding(CFG, experts=mapping), region, chosen)
    assert (experts, dispatch, combine) == (shard.step.experts, *shard.step.alltoall)


def test_the_estimator_prices_the_expected_routing():
    dec = paper_decoding(CFG, "float32", 1)
    assert dec.routing is Routing.EXPECTED and dataclasses.replace(dec, routing=Routing.FIRST) == Decoding(CFG)
