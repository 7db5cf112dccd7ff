"""Every cost fact has one owner, and the copies that used to disagree now agree (issue 17).

- the 16-bit compute rate: a Ledger at the decode's storage dtype books what ``decode.cost`` gives for
  that dtype, emulated and estimated alike, and faster than float32 only when the spec says so;
- the hand-over payload: the float32 residual stream of its tokens (pinned by a literal, not by its owner);
- the streaming estimator's bytes per core: what ``decode.layout.stream_booking`` books, on a grid;
- a placement's speed: the report's rate is the flow schedule's, its bound is never below it;
- the one bisection helper against a linear scan.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from waferrt.cli import heatmap as hm
from waferrt.core.arith import first_true, last_true
from waferrt.core.cost import Cost, compute_cost, flop_cycles, message_cycles, on_lines
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode import layout as dl
from waferrt.decode.cost import handover_bytes, handover_cost, layer_decode_cost, token_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.shards import LayerShard
from waferrt.decode.stage import Entry, StageKind
from waferrt.decode.streaming import streamed_bytes
from waferrt.estimator import streaming as sst
from waferrt.estimator import wafer
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, plan, plan_report
from waferrt.scheduler.speed import placement_seconds

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
HALF = TINY.replace(half_flops_per_cycle=4 * TINY.flops_per_cycle)


@pytest.mark.parametrize("spec", [TINY, HALF])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_ledger_computes_at_its_dtype_as_the_closed_forms_do(spec, dtype):
    region, ledger = Region(0, 0, 4, 3), Ledger(spec, dtype)
    shard = LayerShard(Decoding(CFG, dtype), region, pack_layer(CFG, W.layers[0], region, dtype),
                       KVCapacity(2, 20), ledger)
    for pos in range(4):  # the K/V shift moves pos % 4 columns
        ledger.clear()
        x = Chunks(CFG.dim, 4).split(np.random.default_rng(pos).standard_normal((2, CFG.dim)).astype(np.float32))
        shard.forward(x, np.arange(2), np.full(2, pos))
    want = layer_decode_cost(spec, Decoding(CFG, dtype), region, 4, 2, 3)
    assert ledger.by_op["layer"] == want
    f32 = layer_decode_cost(spec, Decoding(CFG), region, 4, 2, 3)
    faster = spec is HALF and dtype != "float32"
    assert (want.cycles < f32.cycles) == faster and want.flops == f32.flops


def test_an_unknown_ledger_dtype_is_refused():
    with pytest.raises(ValueError, match="float16"):
        Ledger(TINY, "int8")


def test_the_handover_carries_the_float32_residual_stream():
    assert handover_bytes(CFG, 3) == 3 * CFG.dim * 4
    assert handover_bytes(SMOLLM2_135M, 1) == 576 * 4


def test_the_heatmap_draws_the_handover_the_tiles_book():
    """The modelled link bytes of a stage are its hand-over's (float32 activations of one token, a literal
    here) plus its work's: halving the payload anywhere shows."""
    p = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2))
    img = hm.link_bytes(p)
    dec = Decoding(CFG, p.dtype)
    r0, emb = p.layers[0], p.embed
    work = token_cost(TINY, dec, Entry(StageKind.LAYER, None, r0), p.kv_tokens - 1, True).link_bytes
    hand = handover_cost(TINY, emb, r0, 4 * CFG.dim).link_bytes
    assert hand > 0
    assert p.layers.count(r0) == 1  # one layer on the region: its bytes are that layer's and its hand-over's
    assert float(img[r0.y0:r0.y1, r0.x0:r0.x1].sum()) == pytest.approx(hand + work, rel=1e-9)


@pytest.mark.parametrize("config,region,tokens,requests", [
    (CFG, Region(0, 0, 4, 2), 16, 2), (CFG, Region(0, 0, 8, 4), 32, 3),
    (SMOLLM2_135M, Region(0, 0, 64, 32), 512, 8), (SMOLLM2_135M, Region(0, 0, 288, 32), 512, 8),
    (SMOLLM2_135M, Region(0, 0, 576, 16), 1024, 4),
])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_streaming_estimate_books_what_the_tiles_book(config, region, tokens, requests, dtype):
    """The double buffer and the fullest core of a streaming region: the estimator's closed form equals
    decode.layout.stream_booking (what the tiles book). Before issue 17 the estimator sized the buffer by
    the whole head block per core (27,648 B against 3,492 B for SmolLM2 float16 on 64x32)."""
    shape = wafer.Shape(region.w, region.h)
    assert sst._core_bytes(config, shape, tokens, requests, dtype) == dl.most_bytes(
        dl.stream_booking(config, region, tokens, requests, dtype))
    layer = sum(lay.max_block_bytes() for lay in dl.layer_layouts(config, region, dtype).values())
    assert dl.layer_block_bytes(config, region, dtype) == layer


def test_smollm2_double_buffer_on_64x32_is_two_layer_blocks():
    block = dl.stream_block_bytes(SMOLLM2_135M, Region(0, 0, 64, 32), "float16")
    assert block == dl.layer_block_bytes(SMOLLM2_135M, Region(0, 0, 64, 32), "float16") == 3492


@pytest.mark.parametrize("requests", [1, 3, 8])
def test_the_reports_speed_is_the_flow_schedule_and_its_bound_is_above(requests):
    p = plan(SMOLLM2_135M, WSE2, MeshSpec(174, 128, 87, 64), kv=KVReserve(512, 8))
    rep = plan_report(p)
    one, many = placement_seconds(p)
    assert rep.tokens_per_s == pytest.approx(p.kv.requests / many, rel=1e-12)
    assert rep.request_tokens_per_s == pytest.approx(1 / one, rel=1e-12)
    flow = requests / placement_seconds(p, requests)[1]
    assert rep.bound_tokens_per_s(requests) >= flow * (1 - 1e-9)


@given(st.integers(0, 60), st.integers(0, 60), st.integers(-5, 70))
def test_the_bisections_find_what_a_scan_finds(lo, hi, cut):
    assume(lo <= hi)
    scan_first = next((v for v in range(lo, hi + 1) if v >= cut), None)
    scan_last = next((v for v in range(hi, lo - 1, -1) if v <= cut), None)
    assert first_true(lo, hi, lambda v: v >= cut) == scan_first
    assert last_true(lo, hi, lambda v: v <= cut) == scan_last


def test_the_primitives_against_hand_computed_numbers():
    """Both sides of every tie call these owners, so they are pinned here by numbers worked out by hand."""
    assert flop_cycles(WSE2, 1000) == 1000 / 2.0  # the WSE-2's float32 rate: 2 flops per cycle per core
    assert flop_cycles(HALF, 1000, "bfloat16") == 1000 / 8.0 and flop_cycles(HALF, 1000, "float32") == 500
    assert compute_cost(TINY, 64).cycles == 32 and compute_cost(TINY, 64).flops == 64
    # 3 hops at alpha 1, then one stage of beta 8 + 1024 B at 4 B/cycle
    assert message_cycles(TINY, 3, 1, 1024) == 3 * 1.0 + 8.0 + 1024 / 4.0
    lines = on_lines(Cost(hops=2, stages=1, link_bytes=10, messages=3, cycles=7.0), 4)
    assert (lines.hops, lines.stages, lines.link_bytes, lines.messages, lines.cycles) == (2, 1, 40, 12, 7.0)


def test_what_a_streamed_stage_takes_in_by_hand():
    """A layer's weights, the tied table with the final norm, the embedding rows of the items."""
    c = CFG
    layer = 2 * c.dim + (c.n_heads + 2 * c.n_kv_heads) * c.head_dim * c.dim + c.dim * c.n_heads * c.head_dim \
        + 3 * c.hidden_dim * c.dim
    assert streamed_bytes(c, StageKind.LAYER, "float16", 5) == 2 * layer
    assert streamed_bytes(c, StageKind.HEAD, "float32", 5) == 4 * (c.vocab_size + 1) * c.dim
    assert streamed_bytes(c, StageKind.EMBED, "bfloat16", 5) == 2 * 5 * c.dim


def test_the_heatmap_takes_what_a_decode_measured(tmp_path):
    p = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2))
    busy = {str(t): 0.5 for t in p.mesh.tiles()}
    out = hm.heatmap_png(p, tmp_path / "h.png", hm.Measured(busy=busy, sent={}, wall_s=1.0))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="wall_s"):
        hm.Measured(wall_s=-1.0)
