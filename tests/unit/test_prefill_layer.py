"""The prefill on the emulated wafer without Ray (waferrt.decode.prefill): a whole prompt through a layer shard
by MeshGEMM equals the reference's layer_prefill, leaves the K/V from which the decode's next token equals
the reference's, and books exactly prefill_layer_cost (at the storage dtype's compute rate); the packed
weights unpack to the reference's; a whole decode over tiles with prefill gives the reference's tokens and
times each request's first token."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, out_in, pack_layer
from waferrt.decode.prefill import (
    glue_flops,
    layer_step,
    prefill_layer,
    prefill_layer_cost,
    prefill_runs,
    prefill_work_parts,
)
from waferrt.decode.prefill_plan import GEMMS, weight_moves
from waferrt.decode.shards import LayerShard
from waferrt.decode.transport import carry
from waferrt.kernels.gemm import Grid, place
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.reference import Layer, Rope, layer_forward, layer_prefill, rope_cos_sin
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
REGIONS = [Region(0, 0, 4, 4), Region(2, 1, 5, 3), Region(0, 0, 3, 6), Region(0, 0, 1, 1)]


@pytest.mark.parametrize("hop_by_hop", [False, True], ids=["at_once", "hop_by_hop"])
@pytest.mark.parametrize("region", REGIONS, ids=lambda r: f"{r.w}x{r.h}")
def test_the_weights_carried_into_the_gemms_are_the_reference_layers_and_come_back(region, hop_by_hop):
    """Each GEMM's B blocks, carried out of the decode's packed blocks, are kernels.gemm.place's of the
    reference's matrices; carried back, they repack into the decode's arrays."""
    lw, s = W.layers[1], min(region.w, region.h)
    arrays = pack_layer(CFG, lw, region)
    mats = {"wqkv": (lw.wq, lw.wk, lw.wv), "wo": (lw.wo,), "w13": (lw.w_gate, lw.w_up), "w2": (lw.w_down,)}
    for wm in weight_moves(CFG, region, tuple(arrays[key].shape for _, key, _ in GEMMS)):
        b = np.concatenate(mats[wm.key]).T
        square = Region(0, 0, s, s)
        _, want = place("meshgemm", Grid.of(square), square, np.zeros((1, b.shape[0]), np.float32), b)
        got = carry(wm.into, arrays[wm.key], hop_by_hop)
        np.testing.assert_array_equal(got, want, err_msg=wm.key)
        np.testing.assert_array_equal(out_in(carry(wm.back, got, hop_by_hop), wm.out_over), arrays[wm.key])


@pytest.mark.parametrize("tokens", [2, 9, 16])
@pytest.mark.parametrize("region", REGIONS, ids=lambda r: f"{r.w}x{r.h}")
def test_a_prefilled_layer_equals_the_reference_and_the_decode_continues(region, tokens):
    lw, ledger = W.layers[0], Ledger(TINY)
    shard = LayerShard(Decoding(CFG), region, pack_layer(CFG, lw, region), KVCapacity(2, 32), ledger)
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens + 1, CFG.dim)).astype(np.float32)
    kc = np.zeros((CFG.n_kv_heads, 32, CFG.head_dim), np.float32)
    vc = np.zeros_like(kc)
    cos, sin = rope_cos_sin(np.arange(tokens), CFG.head_dim, CFG.rope_theta)
    want = layer_prefill(x[:tokens], Layer(lw, CFG), kc, vc, Rope(np.arange(tokens), cos, sin))
    chunks = Chunks(CFG.dim, region.w)
    got = prefill_layer(shard, chunks.split(x[:tokens]), slot=1)
    np.testing.assert_allclose(chunks.join(got), want, rtol=1e-4, atol=1e-4)
    assert ledger.by_op["prefill"] == prefill_layer_cost(TINY, Decoding(CFG), region, tokens)
    assert shard.kv.positions(1) == list(range(tokens))
    nxt = layer_forward(x[tokens], Layer(lw, CFG), kc, vc, Rope.at(tokens, CFG))
    got = shard.forward(chunks.split(x[tokens:]), np.array([1]), np.array([tokens]))
    np.testing.assert_allclose(chunks.join(got)[0], nxt, rtol=1e-4, atol=1e-4)


def test_the_prefills_element_wise_work_by_hand():
    """Every op the block functions run on the slab records its busiest core's share (decode.net.SquareNet):
    2 tokens of the tiny model (dim 64, hidden 128, 4 + 2 heads of 16) on the 3x3 square of a 3x6 region."""
    # RMSNorm 4 * 2 * 64, RoPE 3 * 2 * (4 + 2) * 16, a residual 2 * 64, RMSNorm, SiLU * up 5 * 2 * 128, a residual
    assert glue_flops(CFG, 2) == (512, 576, 128, 512, 1280, 128)
    parts = {name: c for name, _, c in prefill_work_parts(TINY, Decoding(CFG), Region(0, 0, 3, 6), 2)}
    # each over 9 cores, rounded up: 57 + 64 + 15 + 57 + 143 + 15 (the tie above: what prefill_layer records)
    assert parts["elementwise"].flops == 351


HALF_FAST = TINY.replace(half_flops_per_cycle=4 * TINY.flops_per_cycle)  # 16-bit work 4x the float32 rate


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("region", REGIONS[:2], ids=lambda r: f"{r.w}x{r.h}")
def test_a_prefill_books_its_closed_form_at_the_storage_dtypes_rate(region, dtype):
    """The shard's ledger computes at its storage dtype's rate; so does prefill_layer_cost (Decoding.dtype)."""
    ledger = Ledger(HALF_FAST, dtype)
    shard = LayerShard(Decoding(CFG, dtype), region, pack_layer(CFG, W.layers[0], region, dtype),
                       KVCapacity(2, 32), ledger)
    x = np.random.default_rng(1).standard_normal((9, CFG.dim)).astype(np.float32)
    prefill_layer(shard, Chunks(CFG.dim, region.w).split(x), slot=0)
    assert ledger.by_op["prefill"] == prefill_layer_cost(HALF_FAST, Decoding(CFG, dtype), region, 9)


def test_a_micro_batch_prefills_its_whole_prompts_and_decodes_the_rest():
    meta = np.array([[0, 5, 5, 1, 0], [1, 3, 0, 0, 1], [1, 4, 1, 0, 1], [1, 9, 2, 1, 1], [2, 4, 5, 1, 2],
                     [3, 4, 2, 0, 3], [3, 4, 4, 1, 3]])  # slot 3: not consecutive, decoded
    assert [r.tolist() for r in prefill_runs(meta)] == [[1, 2, 3]]
    chunk = meta[[1, 2, 3]] + [0, 0, 6, 0, 0]  # positions 6..8: a later chunk of a prompt
    assert [r.tolist() for r in prefill_runs(chunk)] == [[0, 1, 2]]
    meta = meta[:5]
    region = Region(0, 0, 4, 4)
    mixed, alone = (LayerShard(Decoding(CFG), region, pack_layer(CFG, W.layers[0], region),
                               KVCapacity(3, 32), Ledger(TINY))
                    for _ in "ab")
    x = np.random.default_rng(0).standard_normal((5, 4, 16)).astype(np.float32)
    for shard in (mixed, alone):  # slots 0 and 2 hold earlier positions
        for pos in range(5):
            shard.forward(x[:2] * 0 + pos, np.array([0, 2]), np.array([pos, pos]))
    got = layer_step(mixed, x, meta)
    np.testing.assert_array_equal(got[1:4], prefill_layer(alone, x[1:4], 1))
    assert mixed.ledger.by_op["prefill"].flops > 0 and "layer" in mixed.ledger.by_op


@pytest.mark.parametrize("mesh", [MeshSpec(8, 8, 4, 4), MeshSpec(16, 16, 8, 8), MeshSpec(8, 8, 8, 8)],
                         ids=["2x2 tiles of 4x4", "2x2 tiles of 8x8", "one tile"])
def test_a_decode_with_prefill_gives_the_reference_tokens_and_times_the_first(mesh):
    placement = plan(CFG, TINY, mesh, kv=KVReserve(64, 2))
    requests = [GenRequest(tuple(range(3, 23)), 6), GenRequest((5, 6, 7, 8, 9, 10, 11, 12), 5),
                GenRequest((9,), 4)]
    sampler = Sampler(temperature=0.9, top_k=30, seed=1)
    want, _ = generate_reference(CFG, W, requests, sampler)
    dec = LocalDecoder(CFG, W, placement).use_prefill()
    got, stats = dec.generate(requests, sampler)
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert any("prefill" in p.ledger.by_op for p in dec.programs.values())
    assert set(stats.ttft_wall_s) == set(stats.ttft_modelled_s) == {0, 1, 2}
    assert 0 < stats.ttft_modelled_s[0] <= stats.modelled_s
    assert stats.prefill_tokens_per_s({0: 20, 1: 8, 2: 1})[0] > 0
