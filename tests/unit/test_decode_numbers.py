"""The modelled numbers of the decode, pinned: each test here fails when its formula is broken.

- ``flow_seconds`` against schedules computed by hand (pipelining, a token fed back, a prompt streaming in,
  a shared region; grouping into micro-batches does not matter);
- ``handover_cost`` against the messages a hand-over really sends, and the tiles booking exactly it;
- requests overlapping at their own pace (the modelled time below the sum of the stage runs, whatever
  the lanes the emulator grouped them in);
- what a stage books in SRAM equal to the planner's budget for that region, on several meshes and dtypes;
- float16 / bfloat16 storage against bit patterns computed here independently of the code under test.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from waferrt.core.cost import broadcast_cost, message_cycles
from waferrt.core.dtypes import to_f32, to_storage
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode.cost import handover_bytes, handover_cost
from waferrt.decode.schedule import Item, StageRun, flow_seconds
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.decode.stage import StageKind
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, PlanOptions, budget, plan, plan_report
from waferrt.scheduler.types import Workload
from waferrt.serving import GenRequest, LocalDecoder

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


def _runs(spec: list) -> list[StageRun]:
    """StageRuns from [(stage, region key, [(request, pos, want, cycles alone), ...]), ...], in that order."""
    return [StageRun(i, st, Region(key, 0, 1, 1), i, 0.0, tuple(Item(*it) for it in items))
            for i, (st, key, items) in enumerate(spec)]


def test_flow_seconds_is_the_hand_computed_schedule():
    """Two requests' tokens through three stages on three regions, unequal cycles: a token leaves stage s
    at max(it left s-1, the region finished the one before) + its cycles at s."""
    runs = _runs([(0, 0, [(0, 0, True, 10), (1, 0, True, 20)]), (1, 1, [(0, 0, True, 50), (1, 0, True, 5)]),
                  (2, 2, [(0, 0, True, 7), (1, 0, True, 30)])])
    # region 0: A 0-10, B 10-30; region 1: A 10-60, B max(30,60)-65; region 2: A 60-67, B max(65,67)-97
    assert flow_seconds(runs, 2, clock_hz=1.0) == 97.0
    assert flow_seconds(runs, 2, clock_hz=2.0) == 48.5
    split = _runs([(0, 0, [(0, 0, True, 10)]), (0, 0, [(1, 0, True, 20)]), (1, 1, [(0, 0, True, 50)]),
                   (1, 1, [(1, 0, True, 5)]), (2, 2, [(0, 0, True, 7)]), (2, 2, [(1, 0, True, 30)])])
    assert flow_seconds(split, 2, clock_hz=1.0) == 97.0  # how the emulator grouped them does not matter


def test_stage_runs_cross_a_process_as_they_are():
    """The tiles hand their stage runs to the host pickled (items as plain tuples on the wire): they come back
    equal, their items Items again, and the schedule of what came back is the same."""
    import pickle

    runs = _runs([(0, 0, [(0, 0, True, 10), (1, 0, False, 20.5)]), (1, 1, [(0, 0, True, 50), (1, 0, True, 5)])])
    back = pickle.loads(pickle.dumps(runs))
    assert back == runs and all(type(it) is Item for r in back for it in r.items)
    assert flow_seconds(back, 1, clock_hz=1.0) == flow_seconds(runs, 1, clock_hz=1.0)


def test_flow_seconds_feeds_a_token_back_and_shares_the_head_region():
    """A request's second token enters only when its first left the head; the embedding (stage 0) and the
    head (stage 2) are one region (key 0) and serve one token at a time."""
    fed_back = _runs([(0, 0, [(0, 0, True, 4)]), (1, 1, [(0, 0, True, 10)]), (2, 0, [(0, 0, True, 6)]),
                      (0, 0, [(0, 1, True, 4)]), (1, 1, [(0, 1, True, 10)]), (2, 0, [(0, 1, True, 6)])])
    # token 0: 0-4 (region 0), 4-14 (region 1), 14-20 (region 0); token 1 after it: 20-24, 24-34, 34-40
    assert flow_seconds(fed_back, 2, clock_hz=1.0) == 40.0
    side_by_side = _runs([(0, 0, [(0, 0, True, 4), (1, 0, True, 4)]), (1, 1, [(0, 0, True, 10), (1, 0, True, 10)]),
                          (2, 0, [(0, 0, True, 6), (1, 0, True, 6)])])
    # region 0: A 0-4, B 4-8; region 1: A 4-14, B 14-24; region 0 again: A 14-20, B 24-30
    assert flow_seconds(side_by_side, 2, clock_hz=1.0) == 30.0
    prompt = _runs([(0, 0, [(0, 0, False, 4), (0, 1, True, 4)]), (1, 1, [(0, 0, False, 10), (0, 1, True, 10)]),
                    (2, 0, [(0, 0, False, 0), (0, 1, True, 6)])])
    # a prompt's tokens stream in: the second enters after the first (4-8), not after the first left the head
    assert flow_seconds(prompt, 2, clock_hz=1.0) == 30.0
    with pytest.raises(ValueError, match="never ran"):  # token 1 waits for token 0 at the head, which never ran
        flow_seconds([r for r in fed_back if (r.stage, r.items[0].pos) != (2, 0)], 2, clock_hz=1.0)


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


def _generate(lanes: int, n: int = 4):
    dec = LocalDecoder(CFG, W, plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 4)), lanes=lanes)
    requests = [GenRequest((5 + i,), 3) for i in range(n)]
    out, stats = dec.generate(requests, Sampler())
    runs = [r for p in dec.programs.values() for r in p.records]
    return dec, runs, stats


def test_tiles_book_one_handover_per_stage_and_micro_batch():
    dec, runs, _ = _generate(lanes=2)
    booked = sum(p.ledger.by_op["handover"].cycles for p in dec.programs.values() if "handover" in p.ledger.by_op)
    regions = [st.region for st in dec.setup.stages()]
    want = sum(handover_cost(TINY, regions[r.stage - 1], regions[r.stage], handover_bytes(CFG, len(r.items))).cycles
               for r in runs if r.stage)
    assert booked == pytest.approx(want) and want > 0


def test_requests_overlap_whatever_the_lanes():
    """Four requests at their own pace: the modelled time is well below the sum of every token's stage
    runs, and the same whether the emulator ran them in two lanes of two or one lane of four."""
    _, runs, stats = _generate(lanes=2)
    serial = sum(it.alone for r in runs for it in r.items) / TINY.clock_hz
    assert {len(r.items) for r in runs} == {2} and stats.modelled_s < 0.5 * serial
    _, runs1, stats1 = _generate(lanes=1)
    assert {len(r.items) for r in runs1} == {4} and stats1.modelled_s == pytest.approx(stats.modelled_s)


@pytest.mark.parametrize("config,spec,mesh,kv", [
    (CFG, TINY, MeshSpec(16, 16, 8, 8), KVReserve(32, 2)),
    (CFG, TINY, MeshSpec(24, 16, 8, 8), KVReserve(48, 3)),
    (SMOLLM2_135M, WSE2, MeshSpec(174, 128, 87, 64), KVReserve(512, 8)),
])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_what_a_stage_books_is_the_planners_budget(config, spec, mesh, kv, dtype):
    p = plan(config, spec, mesh, kv=kv, options=PlanOptions(dtype=dtype))
    setup = DecodeSetup.from_placement(p)
    rep = plan_report(p)
    for s, stage in enumerate(setup.stages()):
        booked, region = stage_sram(setup, s), stage.region
        if stage.kind is StageKind.HEAD:
            assert booked == {}  # the head reads the embedding's table
            continue
        assert {r for r, _ in booked.values()} == {region}
        most = int(sum(nbytes for _, nbytes in booked.values()).max())
        if stage.kind is StageKind.LAYER:
            work = Workload(config, KVReserve(p.kv_tokens, kv.requests), dtype)
            assert most == budget.layer_bytes(work, region.w, region.h)
            assert most in rep.layer_core_bytes
        else:
            assert most == budget.embed_bytes(config, region.w, region.h, dtype) == rep.embed_core_bytes
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
