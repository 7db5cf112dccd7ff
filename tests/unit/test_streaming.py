"""Weight streaming in the emulator (no Ray): one region runs every stage, the blocks come from off-wafer memory.

- the tiny model decodes with the reference's tokens on a mesh whose SRAM cannot hold its weights;
- every stage run books its closed form: the longer of its compute and its block's stream over the ingress
  (the embedding: only its rows; the head: chunk by chunk, none larger on a core than a layer's block);
- the region books what the planner budgets (every layer's K/V, the double buffer, the scratch), and a mesh
  that cannot hold even that is refused with what would do.
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.cost import total
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode import layout as dl
from waferrt.decode.cost import layer_decode_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.schedule import round_seconds
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.decode.stage import StageKind
from waferrt.decode.streaming import head_chunks, head_parts, stage_cycles, streamed_bytes
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, PlanError, violations
from waferrt.scheduler.budget import work_bytes
from waferrt.scheduler.placement import plan_streaming, streaming_mesh
from waferrt.scheduler.speed import placement_seconds
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
KV = KVReserve(16, 3)


def _placement():
    mesh = streaming_mesh(CFG, TINY, KV)
    embed, layer = work_bytes(CFG, "float32")
    assert mesh.width * mesh.height * TINY.sram_bytes < embed + CFG.n_layers * layer  # too small for the weights
    p = plan_streaming(CFG, TINY, mesh, kv=KV)
    assert violations(p) == () and p.streaming and set(p.layers) == {p.embed}
    return p


def test_streaming_decodes_the_reference_tokens_and_books_the_closed_forms():
    p = _placement()
    requests = [GenRequest((5 + i, 9, 2), 5) for i in range(3)]
    sampler = Sampler(temperature=0.8, seed=3)
    out, stats = LocalDecoder(CFG, W, p).generate(requests, sampler)
    ref, _ = generate_reference(CFG, W, requests, sampler)
    assert [c.tokens for c in out] == [c.tokens for c in ref]
    region, last = p.embed, CFG.n_layers + 1
    for r in stats.runs:
        b, want = len(r.items), sum(it.want for it in r.items)
        if r.stage == 0:
            compute = 0.0
        elif r.stage < last:
            (pos,) = {it.pos for it in r.items} if len({it.pos for it in r.items}) == 1 else (None,)
            if pos is None:  # a prompt's tokens together: their own positions (checked by the decode tests)
                continue
            compute = layer_decode_cost(TINY, Decoding(CFG), region, pos + 1, b, pos % region.w).cycles
        elif not want:
            assert r.cycles == 0
            continue
        else:
            compute = total(c for _, _, c in head_parts(TINY, Decoding(CFG), region, want)).cycles
        kind = StageKind.EMBED if r.stage == 0 else StageKind.LAYER if r.stage < last else StageKind.HEAD
        want_cycles = stage_cycles(TINY, compute, streamed_bytes(CFG, kind, "float32", b))
        assert r.cycles == pytest.approx(want_cycles, rel=1e-9), (r.stage, r.mb)
        assert sum(it.alone for it in r.items) == pytest.approx(r.cycles, rel=1e-12)  # shares of the run


def test_the_double_buffer_is_sized_by_the_largest_layer():
    """SmolLM2's head (its tied table) is 8x a layer: it streams in chunks no larger than a layer's block, so a
    288x32 region holds every layer's K/V (512 tokens x 8 requests), the double buffer and the scratch at
    float32 -- 9,216 cores whose 442 MB of SRAM could not hold the 540 MB of weights."""
    region = Region(0, 0, 288, 32)
    layer = sum(lay.max_block_bytes() for lay in dl.layer_layouts(SMOLLM2_135M, region).values())
    assert dl.stream_block_bytes(SMOLLM2_135M, region) == layer
    chunks = head_chunks(SMOLLM2_135M, region, "float32")
    assert len(chunks) > 1 and chunks[-1][1] == -(-SMOLLM2_135M.vocab_size // 32)
    assert dl.most_bytes(dl.stream_booking(SMOLLM2_135M, region, 512, 8)) <= WSE2.sram_bytes
    assert 288 * 32 * WSE2.sram_bytes < SMOLLM2_135M.params() * 4


def test_the_region_books_what_the_planner_budgets_and_a_mesh_too_small_is_refused():
    p = _placement()
    setup = DecodeSetup.from_placement(p)
    booked = {}
    for s in range(len(setup.stages())):
        booked.update(stage_sram(setup, s))
    assert sorted(booked) == ["layer0.kv", "layer1.kv", "layer2.kv", "stream.buffer", "stream.scratch"]
    most = int(np.max(sum(nbytes for _, nbytes in booked.values())))
    assert most == dl.most_bytes(dl.stream_booking(CFG, p.embed, p.kv_tokens, KV.requests)) <= TINY.sram_bytes
    small = streaming_mesh(CFG, TINY, KV)
    with pytest.raises(PlanError, match="use a wider tile"):
        plan_streaming(CFG, TINY, small.__class__(1, small.height, 1, small.height), kv=KV)


def test_the_estimate_of_a_streaming_placement_is_what_the_emulator_books():
    """The same mesh and model give the same time per token, emulated and estimated (the brief asks 1%)."""
    p = _placement()
    out = []
    for n in (1, 3):
        dec = LocalDecoder(CFG, W, p)
        _, stats = dec.generate([GenRequest((3 + i,), 3) for i in range(n)], Sampler())  # last round: 3 held
        out.append(round_seconds(stats.runs, len(dec.setup.stages()) - 1, TINY.clock_hz))
    one, many = placement_seconds(p, 3, context=3)
    assert out == pytest.approx([one, many], rel=1e-9)
