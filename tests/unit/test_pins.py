"""Hand-computed pins for the owners of cost facts (issue 31): each number below is worked out by hand in
its comment, so that breaking the owner fails here even where both sides of every tie call it.

- ``core.cost.alltoall_cost``: a phase counted link by link (``decode.linkload.LinkLoad``) and a line's
  all-to-all (``line_alltoall_cost``), on TINY (alpha 1, beta 8, 4 bytes per link per cycle);
- ``core.cost.cycles_seconds`` (and ``Cost.seconds``): cycles at the spec's clock;
- ``core.cost.segment_bytes``: the padded segment of a ring / pipeline allreduce;
- breaks that only one test caught before (issue 31): ``flop_cycles`` (a GEMV), ``handover_cost``,
  ``stream_step_cycles`` / ``streamed_bytes`` (a stream-bound step), ``layer_booking``,
  ``model_flops_per_token``, ``first_true``;
- ``decode.layout``'s ``activation_bytes`` (a layer core's scratch), ``kv_core_bytes`` (its K/V) and
  ``stream_core_bytes`` (a streaming region's fullest core), for one and two head groups, on the tiny model
  (dim 64, 4 heads, 2 K/V heads, head_dim 16, hidden 128, 3 layers, vocab 256) over a 4x2 region;
- ``core.layout.core_bytes``: the bytes a layout puts on every core;
- training's closed forms that only ties caught: ``core.train_cost.block_forward_parts`` (the GEMMs, the
  attention per sequence, the residual adds on one core), ``estimator.train_layer.layer_parts``,
  ``block_backward_parts``' layout moves on a 2x2 square, ``head_backward_parts`` in chunks;
- the decode's closed forms that only ties caught (a tie cannot fail where both sides call the owner):
  ``Decoding.line_reduce`` (and the K-tree of ``allreduce_cost``), ``layer_decode_parts``' flops,
  ``token_cost`` at the head, ``stage_handover``, what sparse attention adds (``sparse_parts``), and an MoE
  FFN's ``moe_parts`` and ``routed_parts`` (tiny MoE: 4 experts of width 32, top-2).
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.arith import first_true
from waferrt.core.cost import (
    Cost,
    Phase,
    allreduce_cost,
    alltoall_cost,
    cycles_seconds,
    gemv_cost,
    line_alltoall_cost,
    segment_bytes,
)
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.layout import Layout, core_bytes
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY, WSE2
from waferrt.core.train_cost import TrainShape, block_backward_parts, block_forward_parts, head_backward_parts
from waferrt.decode import layout as dl
from waferrt.decode.cost import handover_cost, layer_decode_parts, sparse_parts, stage_handover, token_cost
from waferrt.decode.decoding import ELEMENTWISE_FLOPS, Decoding
from waferrt.decode.linkload import LinkLoad
from waferrt.decode.routed_cost import moe_parts, routed_parts
from waferrt.decode.stage import Entry, StageKind
from waferrt.decode.streaming import stream_step_cycles
from waferrt.decode.topk import TopKRow
from waferrt.estimator.train import model_flops_per_token
from waferrt.estimator.train_layer import Run, layer_parts
from waferrt.model import tiny_config, tiny_moe_config

CFG = tiny_config()


def test_a_phase_counted_link_by_link_by_hand():
    """Two messages at once on a 5x2 region: 40 bytes 3 hops east along row 0, 8 bytes 1 hop south down
    column 4. Longest route 3 hops, busiest link 40 bytes: 3*1 + 8 + 40/4 = 21 cycles; 3*40 + 8 link bytes."""
    load = LinkLoad(Region(0, 0, 5, 2))
    load.along_row(0, 1, 4, 40)
    load.along_column(4, 0, 1, 8)
    c = alltoall_cost(TINY, load)
    assert (c.hops, c.stages, c.messages, c.link_bytes) == (3, 1, 2, 128)
    assert c.cycles == 21.0
    assert alltoall_cost(TINY, LinkLoad(Region(0, 0, 5, 2))).cycles == 0  # nothing sent: free


def test_a_line_alltoall_by_hand():
    """A mesh line of 3, 30 bytes per core: chunks of 10; the middle links carry 2 chunks (1x2 cross each),
    the longest route 2 hops: 2*1 + 8 + 20/4 = 15 cycles; 6 messages; hops summed 8 (1+2+1 each way) x 10."""
    c = line_alltoall_cost(TINY, 3, 30)
    assert (c.hops, c.messages, c.link_bytes, c.cycles) == (2, 6, 80, 15.0)
    assert alltoall_cost(TINY, Phase(hops=2, messages=6, link_bytes=80, busiest=20)) == c


def test_a_layer_cores_scratch_and_kv_by_hand():
    """4x2 region, 20 positions, 3 requests, float32. One head group: dim_c 16, hid_r 64, hd_r 2*ceil(8/2) = 8,
    4 q / 2 K/V heads, 5 positions per column: scratch 2*4*(2*16 + (8+4)*8 + 2*64 + 4*5) = 2208 bytes; K/V
    2*3*2*8*5*4 = 1920. Two groups (one row each): hd_r 16, 2 q / 1 K/V heads: scratch 2*4*(32 + 6*16 + 128 +
    2*5) = 2128, K/V 2*3*1*16*5*4 = 1920."""
    region = Region(0, 0, 4, 2)
    assert dl.activation_bytes(CFG, region, 20) == 2208 and dl.kv_core_bytes(CFG, region, 20, 3) == 1920
    assert dl.activation_bytes(CFG, region, 20, 2) == 2128
    assert dl.kv_core_bytes(CFG, region, 20, 3, "float32", 2) == 1920
    assert dl.kv_core_bytes(CFG, region, 20, 3, "float16") == 960


@pytest.mark.parametrize("w,h,tokens", [(4, 2, 20), (3, 4, 7), (8, 1, 64)])
def test_the_kv_owner_is_what_the_kv_layout_books(w, h, tokens):
    region = Region(0, 0, w, h)
    assert dl.most_bytes({"kv": (dl.kv_booking(CFG, region, tokens, 2, "float16"),)}) == dl.kv_core_bytes(
        CFG, region, tokens, 2, "float16")


def test_a_streaming_cores_sum_by_hand():
    """The same 4x2 region streaming: 3 layers' K/V (3 x 1920), the larger scratch (a layer's 2208 against the
    head's 2*128*4 + 2*16*4 = 1152) and two weight blocks of a layer, (2*16 + 12*8*16 + 3*64*16) * 4 = 18560
    bytes each (the head's chunk, (128 + 1)*16*4 = 8256, is smaller): 5760 + 2208 + 37120 = 45088."""
    region = Region(0, 0, 4, 2)
    assert dl.stream_block_bytes(CFG, region, "float32") == 18560
    assert dl.stream_core_bytes(CFG, region, 20, 3) == 45088
    assert dl.most_bytes(dl.stream_booking(CFG, region, 20, 3)) == 45088


def test_a_ring_allreduces_padded_segments_by_hand():
    """100 bytes (25 floats) over a mesh line of 4: segments of ceil(25/4) = 7 floats, 28 bytes (the last one
    padded). The folded ring's step: longest 2 hops, 6 hops in all; 2*(4-1) = 6 steps of 28 bytes: link bytes
    6*6*28 = 1008, cycles 6*(2*1 + 8 + 28/4) = 102."""
    assert segment_bytes(100, 4) == 28 and segment_bytes(96, 4) == 24 and segment_bytes(4, 3) == 4
    c = allreduce_cost(TINY, "ring", 4, 100)
    assert (c.hops, c.stages, c.link_bytes, c.messages, c.cycles) == (12, 6, 1008, 24, 102.0)


def test_cycles_in_seconds_by_hand():
    """Both presets' clocks are 1.1 GHz: 1.1e9 cycles are a second, 2.2e6 cycles 2 ms."""
    assert cycles_seconds(TINY, 1.1e9) == 1.0 and Cost(cycles=2.2e6).seconds(WSE2) == 2.2e6 / 1.1e9
    assert abs(Cost(cycles=2.2e6).seconds(WSE2) - 2e-3) < 1e-15


def test_a_gemv_alone_by_hand():
    """An 8x16 block on one core, nothing to reduce: 2*8*16 = 256 flops at 2 a cycle, 128 cycles."""
    assert gemv_cost(TINY, (8, 16), 1) == Cost(flops=256, cycles=128.0)


def test_a_handover_by_hand():
    """64 bytes from a 4x2 region at x 0..3 to a 4x3 one at x 6..9: 3 hops across the gap (3*1 + 8 + 64/4 =
    27 cycles, 192 link bytes), then each of the 4 columns multicasts its 16 bytes 2 hops down (2*1 + 8 +
    16/4 = 14 cycles; 2 messages a column, 2*64 link bytes)."""
    c = handover_cost(TINY, Region(0, 0, 4, 2), Region(6, 0, 4, 3), 64)
    assert c == Cost(hops=5, stages=2, link_bytes=320, messages=9, cycles=41.0)


def test_a_stream_bound_step_by_hand():
    """With the ingress at one byte a cycle every stage of a streaming 4x2 region waits for its block: 2 tokens'
    embedding rows (2*64*4 = 512 bytes), 3 layers of (2*64 + 8*16*64 + 64*64 + 3*128*64)*4 = 147968 bytes,
    the tied table and final norm (257*64*4 = 65792): 512 + 3*147968 + 65792 = 510208 cycles."""
    spec = TINY.replace(ingress_bytes_per_s=TINY.clock_hz)
    assert stream_step_cycles(spec, Decoding(CFG), Region(0, 0, 4, 2), 20, 2) == 510208.0


def test_a_layer_regions_booking_by_hand():
    """One layer on the 4x2 region: its weight blocks (2*16 + 12*8*16 + 3*64*16)*4 = 18560 bytes, K/V 1920
    and scratch 2208 (test_a_layer_cores_scratch_and_kv_by_hand): 22688 on the fullest core."""
    assert dl.most_bytes(dl.layer_booking(CFG, Region(0, 0, 4, 2), 20, 3)) == 22688


def test_the_training_flops_of_a_token_by_hand():
    """The tiny model's 36992 weights a layer (norms 2*64, q/k/v/o 4*16*64 + 2*2*16*64 + ..., MLP 3*128*64),
    3 layers and the 256x64 table: 127360 weights; 10 positions: 3*(2*127360 + 3*2*10*64) = 775680."""
    assert model_flops_per_token(CFG, 10) == 775680


def test_the_first_true_by_hand():
    assert first_true(0, 10, lambda v: v * v >= 10) == 4 and first_true(0, 3, lambda v: v > 5) is None


def test_a_line_reduce_by_hand():
    """8 bytes reduced on 2 lines of 5 cores (K-tree, K=2, TINY's mesh): groups of 3 (2*2 < 5 <= 3*3); [0 1 2]
    reduces both halves into 1 at once, [3 4] into 4 (one step of 1 hop, 3 streams in all with the next
    level's), then 1 hands its sum 3 hops to 4, which multicasts it back 4 hops: 1 + 3 + 4 = 8 hops, 3 stages;
    cycles (1 + 3)*1 + 2*8 + 3 streams * 8/4 + (4*1 + 8 + 8/4) = 40. A line: 3 + 1 + 4 = 8 messages,
    (1 + 1 + 1 + 3)*8 + 4*8 = 80 link bytes; on 2 lines 16 and 160."""
    c = Decoding(CFG).line_reduce(TINY, "y", 5, 8, 2)
    assert c == Cost(hops=8, stages=3, link_bytes=160, messages=16, cycles=40.0)


def test_a_layers_flops_by_hand():
    """One token through a tiny layer on the 4x2 region, 20 positions (5 a core), float32: dim_c 16, hd_r 8,
    4 q / 2 K/V heads, hid_r 64. Norms 2 * 4*16 = 128, qkv 2*16*(4 + 2*2)*8 = 2048, RoPE 3*(4 + 2)*8 = 144,
    scores and P.V 2 * 2*4*8*5 = 640, softmax 6*4*5 = 120, wo 2*4*8*16 = 1024, residuals 2*16 = 32, the FFN
    2*16*2*64 + 5*64 + 2*64*16 = 6464: 10600 flops; the softmax's 120 at 2 a cycle, 60 cycles."""
    parts = layer_decode_parts(TINY, Decoding(CFG), Region(0, 0, 4, 2), 20)
    assert sum(c.flops for _, _, c in parts) == 10600
    assert [c for name, _, c in parts if name == "softmax"] == [Cost(flops=120, cycles=60.0)]


def test_a_token_at_the_head_by_hand():
    """A token wanting logits at the head on the 4x2 region its last layer holds (nothing moves in): the final
    norm's 4-byte sum of squares reduced over the 4 columns (K-tree of 4: 0->1 and 2->3 at once, 1->3 two hops,
    3 multicasts 3 hops: 3*1 + 2*8 + 2 streams * 4/4 + 3 + 8 + 4/4 = 33 cycles), its 4*16 flops (32 cycles),
    the head's 128 vocabulary rows a core row x 16 columns: 2*128*16 = 4096 flops (2048 cycles), its 512 bytes
    of partial logits reduced the same way (3 + 16 + 2*128 + 3 + 8 + 128 = 414): 2527 cycles. One that wants
    none books nothing."""
    region = Region(0, 0, 4, 2)
    head = Entry(StageKind.HEAD, region, region)
    c = token_cost(TINY, Decoding(CFG), head, 7, True)
    assert (c.flops, c.hops, c.stages, c.cycles) == (4160, 12, 6, 2527.0)
    assert token_cost(TINY, Decoding(CFG), head, 7, False) == Cost()


def test_a_stage_handover_by_hand():
    """One token's float32 residual stream (64 * 4 = 256 bytes) from a 4x2 region at x 0..3 into a 4x3 one at
    x 6..9: 3 hops across the gap (3*1 + 8 + 256/4 = 75 cycles, 768 link bytes), then each of the 4 columns
    multicasts its 64 bytes 2 hops down (2*1 + 8 + 64/4 = 26 cycles; 2 messages a column, 2*256 link bytes).
    The first stage takes nothing in."""
    c = stage_handover(TINY, CFG, Region(0, 0, 4, 2), Region(6, 0, 4, 3), 1)
    assert c == Cost(hops=5, stages=2, link_bytes=1280, messages=9, cycles=101.0)
    assert stage_handover(TINY, CFG, None, Region(6, 0, 4, 3), 1) == Cost()


def test_an_moe_ffn_by_hand():
    """The tiny MoE (dim 64, 4 experts of width 32, top-2) on a 1x2 region, ER: two bands of one core, experts
    0 and 1 on band 0 (the row 0). A zero router's token picks experts 0 and 1: the router 2*64*4 = 512 flops
    (256 cycles; nothing to reduce on one column); both experts run on band 0 one after the other, each
    2*64*2*32 + 5*32 + 2*32*64 = 12448 flops: 24896 flops, 12448 cycles; the dispatch moves nothing (every
    band holds the whole token); the combine sends band 0's 64 float32 (256 bytes) one hop down to row 1:
    1 + 8 + 256/4 = 73 cycles. Three tokens: the router and experts three times, the combine's link carries
    768 bytes: 1 + 8 + 768/4 = 201 cycles. A token routed to experts 0 and 2 (routed_parts) runs one expert on
    each band side by side (6224 cycles) and its combine crosses the link between them both ways at once (73)."""
    dec, region = Decoding(tiny_moe_config(n_experts=4, top_k=2)), Region(0, 0, 1, 2)
    one = {name: c for name, _, c in moe_parts(TINY, dec, region, 1)}
    assert one["router"] == Cost(flops=512, cycles=256.0) and one["router.reduce"] == Cost()
    assert one["experts"] == Cost(flops=24896, cycles=12448.0) and one["dispatch"] == Cost()
    assert one["combine"] == Cost(hops=1, stages=1, link_bytes=256, messages=1, cycles=73.0)
    three = {name: c for name, _, c in moe_parts(TINY, dec, region, 3)}
    assert three["experts"].cycles == 3 * 12448 and three["combine"].cycles == 201.0
    experts, dispatch, combine = routed_parts(TINY, dec, region, np.array([[0, 2]]))
    assert (experts.cycles, dispatch, combine.cycles) == (6224.0, Cost(), 73.0)


def test_what_sparse_attention_adds_by_hand():
    """One token's 4 query heads on the tiny layer's 4x2 region, 5 positions held a core, 8 kept: the prediction
    2*4*8*5 = 320 flops (hd_r 8; TINY computes float16 at 2 a cycle: 160 cycles), its 4*4*5 = 80 bytes of
    partial scores reduced down each of the 4 columns of 2 cores (K-tree of 2: 0 -> 1 one hop, 1 multicasts
    back: (1 + 8) + 80/4 + (1 + 8 + 80/4) = 58 cycles, 2 hops, 2 stages; 2 messages and 160 link bytes a
    column, 8 and 640 in all); then the row's top-K (decode.topk.topk_cost, pinned in test_topk_kernel)."""
    parts = {name: c for name, _, c in sparse_parts(TINY, Decoding(CFG), Region(0, 0, 4, 2), TopKRow(4, 5, 4, 8))}
    assert parts["predict"] == Cost(flops=320, cycles=160.0)
    assert parts["predict.reduce"] == Cost(hops=2, stages=2, link_bytes=640, messages=8, cycles=58.0)


def test_what_a_layout_puts_on_each_core_by_hand():
    """A (10, 7, 2) float16 tensor on a 3x2 region, its rows split down the region's rows (5 and 5), its
    columns over the region's columns (largest chunk first: 3, 2, 2), its last axis whole on every core:
    5*3*2*2 = 60 bytes on the first column's cores, 5*2*2*2 = 40 on the others'."""
    lay = Layout((10, 7, 2), Region(0, 0, 3, 2), ("y", "x", None), dtype="float16")
    assert core_bytes(lay).tolist() == [[60, 40, 40], [60, 40, 40]] and lay.max_block_bytes() == 60


def test_a_blocks_forward_on_one_core_by_hand():
    """The tiny block's forward over 2 sequences of 4 tokens on one core (8 token rows, nothing moves): the
    GEMMs 8 tokens x (Q 2*64*16*4 + K, V 2 * 2*64*16*2 + O 2*16*64*4 + gate, up 2 * 2*64*128 + down
    2*128*64 = 73728) = 589824 flops; the attention per sequence, its 2*4 = 8 heads over 4 positions: Q.K^T
    and P.V 2 * 2*8*4*4*16 = 8192, the softmax 6*8*4*4 = 768: 8960 flops (4480 cycles) -- over the 8 x 8
    block of both sequences it would be twice that; the two residual adds 2*8*64 = 1024 flops."""
    parts = block_forward_parts(TINY, CFG, TrainShape(2, 4), 1, ELEMENTWISE_FLOPS)
    assert parts["meshgemm"].flops == 589824 and parts["residual"] == Cost(flops=1024, cycles=512.0)
    assert parts["attention"].flops == 8960 and parts["attention"].cycles == 4480.0
    assert layer_parts(TINY, CFG, Run(2, 4, 1))["forward.attention"].flops == 8960


def test_a_blocks_backward_layout_moves_by_hand():
    """The backward's layout moves on a 2x2 square (8 token rows: 4 a core row; dim 32, hidden 64, head_dim 8
    a core): six operands skewed, 4*64, 4*32, 4*4*8, 2 * 4*2*8 and 4*32 float32 (1024, 512, 512, 256, 256,
    512 bytes); on a side of 2 a skew is one round in which one line's two cores pass their block one hop:
    9 + bytes/4 cycles, 2 messages, 2 * bytes over the links. In all 6 hops, 6 stages, 12 messages,
    2*3072 = 6144 link bytes, 6*9 + 3072/4 = 822 cycles."""
    c = block_backward_parts(TINY, CFG, TrainShape(2, 4), 2, ELEMENTWISE_FLOPS["softmax"])["relayout"]
    assert c == Cost(hops=6, stages=6, link_bytes=6144, messages=12, cycles=822.0)


def test_the_head_in_chunks_by_hand():
    """The tied head's backward for 8 tokens over the 256-word vocabulary, dim 64, on one core. Whole: three
    GEMMs (logits, dh, dE) of 2*8*256*64 = 262144 flops and cross-entropy's 8 a logit, 8*8*256 = 16384:
    802816. In 2 chunks of 128 words each chunk runs twice: its stats (the logits, 131072, and its 8192
    cross-entropy flops: 2 x 139264 = 278528) and its grads (three GEMMs and the cross-entropy again: 2 x
    401408 = 802816) -- the logits computed twice."""
    shape = GemmShape(8, 256, 64, 1, 1)
    assert head_backward_parts(TINY, shape)["head_backward"].flops == 802816
    chunked = head_backward_parts(TINY, shape, "float32", 2)
    assert (chunked["head_stats"].flops, chunked["head_grads"].flops) == (278528, 802816)
