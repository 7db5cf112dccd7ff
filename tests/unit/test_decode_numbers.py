"""The modelled numbers of the decode, pinned: each test here fails when its formula is broken.

- ``pipeline_seconds`` against a schedule computed by hand;
- ``handover_cost`` against the messages a hand-over really sends, and the tiles booking exactly it;
- micro-batching overlapping the stages (a step's modelled time below the sum of its stages' cycles);
- what a stage books in SRAM equal to the planner's budget for that region, on several meshes and dtypes;
- float16 / bfloat16 storage against bit patterns computed here independently of the code under test.
"""

from __future__ import annotations

import struct
from itertools import pairwise

import numpy as np
import pytest

from waferrt.core.cost import broadcast_cost, message_cycles
from waferrt.core.dtypes import to_f32, to_storage
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode.cost import handover_cost, pipeline_seconds
from waferrt.decode.program import micro_batches
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, budget, plan, plan_report
from waferrt.serving import LocalDecoder

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


def test_pipeline_seconds_is_the_hand_computed_schedule():
    """Three stages with unequal cycles, two micro-batches: item i leaves stage s at
    max(it left s-1, item i-1 left s) + its cycles at s."""
    cycles = {(0, 0): 10, (0, 1): 20, (1, 0): 50, (1, 1): 5, (2, 0): 7, (2, 1): 30}
    # stage 0: mb0 leaves at 10, mb1 at 10+20=30; stage 1: mb0 at 10+50=60, mb1 at max(30,60)+5=65;
    # stage 2: mb0 at 60+7=67, mb1 at max(65,67)+30=97
    assert pipeline_seconds(cycles, 3, 2, clock_hz=1.0) == 97.0
    assert pipeline_seconds(cycles, 3, 2, clock_hz=2.0) == 48.5
    assert pipeline_seconds({(0, 0): 4.0}, 3, 1, clock_hz=1.0) == 4.0  # missing (stage, item): 0 cycles


def test_handover_cost_counts_the_messages_a_handover_sends():
    src, dst, nbytes = Region(0, 0, 4, 3), Region(6, 1, 4, 3), 1024  # 3 hops apart; dst has 4 cols, 3 rows
    c = handover_cost(WSE2, src, dst, nbytes)
    # the move: one message of nbytes over 3 hops; then every one of dst's 4 columns multicasts its
    # 256-byte chunk down 2 rows: 4 x 2 messages, 4 x 2 x 256 link bytes, one routing stage
    assert (c.hops, c.stages, c.messages) == (3 + 2, 2, 1 + 8)
    assert c.link_bytes == 3 * 1024 + 8 * 256
    assert c.cycles == message_cycles(WSE2, 3, 1, 1024) + broadcast_cost(WSE2, 3, 256).cycles
    touching = handover_cost(WSE2, Region(0, 0, 2, 1), Region(2, 0, 2, 1), 64)  # one row: no multicast
    assert (touching.hops, touching.stages, touching.messages, touching.link_bytes) == (1, 1, 1, 64)


def _decoder(mesh: MeshSpec) -> LocalDecoder:
    return LocalDecoder(CFG, W, plan(CFG, TINY, mesh, kv=KVReserve(32, 4)))


def _one_step(dec: LocalDecoder, items: list) -> list:
    return list(dec.fabric.run_spmd(lambda t, links: dec.programs[t].step("s1", items)).values())


def test_tiles_book_one_handover_per_stage_and_micro_batch():
    dec = _decoder(MeshSpec(16, 16, 8, 8))
    items = [(slot, 5 + slot, 0, True) for slot in range(4)]
    _one_step(dec, items)
    booked = sum(p.ledger.by_op["handover"].cycles for p in dec.programs.values() if "handover" in p.ledger.by_op)
    regions = [r for _, _, r in dec.setup.stages()]
    want = sum(handover_cost(TINY, a, b, 4 * CFG.dim * len(mb)).cycles
               for mb in micro_batches(len(items)) for a, b in pairwise(regions))
    assert booked == pytest.approx(want) and want > 0


def test_micro_batches_overlap_the_stages():
    assert [len(m) for m in micro_batches(1)] == [1]
    assert [len(m) for m in micro_batches(4)] == [2, 2]
    assert [len(m) for m in micro_batches(20)] == [7, 7, 6]
    dec = _decoder(MeshSpec(16, 16, 8, 8))
    results = _one_step(dec, [(slot, 5 + slot, 0, True) for slot in range(4)])
    cycles = {k: v for r in results for k, v in r.cycles.items()}
    n_stages = len(dec.setup.stages())
    pipelined = pipeline_seconds(cycles, n_stages, 2, 1.0)
    assert {m for _, m in cycles} == {0, 1} and results[0].parts == 2
    assert pipelined < 0.75 * sum(cycles.values())  # the second micro-batch rides behind the first


@pytest.mark.parametrize("cfg,spec,mesh,kv", [
    (CFG, TINY, MeshSpec(16, 16, 8, 8), KVReserve(32, 2)),
    (CFG, TINY, MeshSpec(24, 16, 8, 8), KVReserve(48, 3)),
    (SMOLLM2_135M, WSE2, MeshSpec(174, 128, 87, 64), KVReserve(512, 8)),
])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_what_a_stage_books_is_the_planners_budget(cfg, spec, mesh, kv, dtype):
    p = plan(cfg, spec, mesh, kv=kv, dtype=dtype)
    setup = DecodeSetup.from_placement(p)
    rep = plan_report(p)
    for s, (kind, _, region) in enumerate(setup.stages()):
        booked = stage_sram(setup, s)
        if kind == "head":
            assert booked == {}  # the head reads the embedding's table
            continue
        assert {r for r, _ in booked.values()} == {region}
        most = int(sum(nbytes for _, nbytes in booked.values()).max())
        if kind == "layer":
            assert most == budget.layer_bytes(cfg, region.w, region.h, p.kv_tokens, kv.requests, dtype)
            assert most in rep.layer_core_bytes
        else:
            assert most == budget.embed_bytes(cfg, region.w, region.h, dtype) == rep.embed_core_bytes
        assert most <= spec.sram_bytes


# -- storage dtypes against independent bit patterns ------------------------------------------------------
SPECIAL = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 1e-8, 3.14159265, 1.00390625, 1.01171875, 3e38, -3e38,
                    np.inf, -np.inf, 1.17549435e-38, 9.2e-41], dtype=np.float32)


def _bf16_bits(x: float) -> int:
    """bfloat16 of a float32, round to nearest, ties to even, written from the IEEE bit layout by hand."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    upper, lower = bits >> 16, bits & 0xFFFF
    if lower > 0x8000 or (lower == 0x8000 and upper & 1):
        upper += 1
    return upper & 0xFFFF


def test_bfloat16_storage_is_round_to_nearest_even():
    rng = np.random.default_rng(3)
    x = np.concatenate([SPECIAL, rng.standard_normal(2000).astype(np.float32) * 100])
    got = to_storage(x, "bfloat16")
    assert got.dtype == np.uint16
    assert got.tolist() == [_bf16_bits(float(v)) for v in x]
    assert _bf16_bits(1.00390625) == 0x3F80 and _bf16_bits(1.01171875) == 0x3F82  # two ties, both to even
    back = to_f32(got, "bfloat16")
    assert back.dtype == np.float32
    assert [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in back] == [b << 16 for b in got.tolist()]


def test_float16_storage_is_ieee_half():
    rng = np.random.default_rng(4)
    x = np.concatenate([SPECIAL[:7], rng.standard_normal(2000).astype(np.float32)])
    got = to_storage(x, "float16")
    want = [struct.unpack("<H", struct.pack("<e", float(v)))[0] for v in x]  # Python's own binary16
    assert got.view(np.uint16).tolist() == want
    assert to_f32(got, "float16").tolist() == [struct.unpack("<e", struct.pack("<H", b))[0] for b in want]
