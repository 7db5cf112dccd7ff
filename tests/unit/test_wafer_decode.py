"""The wafer decode without Ray: layer shards against the reference, the shift-based KV cache, and the
whole tile pipeline (in-process fabric) over meshes of 1x1, 1xN, 2x2 and 3x2 tiles and with dead cores."""


import numpy as np
import pytest

from waferrt.core.dtypes import to_f32, to_storage
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Coord, MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity, KVCapacityError
from waferrt.decode.pack import Chunks, pack_embed, pack_layer
from waferrt.decode.setup import DecodeSetup, PlacementError
from waferrt.decode.shards import EmbedShard, LayerShard
from waferrt.fabric.comm import Collectives
from waferrt.model import LayerWeights, LlamaWeights, ReferenceModel, Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, PlanOptions, plan, plan_report
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


@pytest.mark.parametrize("rows,cols", [(1, 1), (2, 3), (4, 5), (3, 7), (8, 16)])
@pytest.mark.parametrize("algo", ["ktree", "ring", "pipeline"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_layers_on_cores_equal_the_reference(rows, cols, algo, fast):
    region, coll = Region(0, 0, cols, rows), Collectives(algo, 2, fast)
    ledger = Ledger(TINY)
    dec = Decoding(CFG, coll=coll)
    shards = [LayerShard(dec, region, pack_layer(CFG, lw, region), KVCapacity(2, 24), ledger) for lw in W.layers]
    embed = EmbedShard(CFG, region, pack_embed(CFG, W.embed, W.final_norm, region), ledger, coll)
    ref, chunks = ReferenceModel(CFG, W), Chunks(CFG.dim, cols)
    cache = ref.new_cache()
    for pos, tok in enumerate([5, 17, 100, 3, 9, 200, 7, 8]):
        want = ref.step(tok, pos, cache)
        x = embed.lookup(np.array([tok]))
        np.testing.assert_array_equal(chunks.join(x)[0], W.embed[tok])
        for shard in shards:
            x = shard.forward(x, np.array([1]), np.array([pos]))
            assert x.dtype == np.float32
        got = embed.logits(x)[0]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert ledger.by_op["layer"].flops > 0 and (ledger.by_op["layer"].hops > 0) == (region.size > 1)


def test_kv_cache_stays_balanced_by_shifting():
    region = Region(0, 0, 5, 2)
    shard = LayerShard(Decoding(CFG), region, pack_layer(CFG, W.layers[0], region), KVCapacity(1, 23), Ledger(TINY))
    x = np.zeros((1, 5, shard.arrays["attn_norm"].shape[1]), np.float32)
    for pos in range(23):
        shard.forward(x, np.array([0]), np.array([pos]))
        held = shard.kv.held(0)
        assert held.sum() == pos + 1
        assert held.max() - held.min() <= 1 and np.all(np.diff(held) <= 0)
    assert shard.kv.positions(0) == list(range(23))
    with pytest.raises(KVCapacityError, match="full"):
        for pos in range(23, 30):
            shard.forward(x, np.array([0]), np.array([pos]))


MESHES = {
    "1x1 tiles": MeshSpec(8, 8, 8, 8),
    "1xN tiles": MeshSpec(32, 4, 8, 4),
    "2x2 tiles": MeshSpec(16, 16, 8, 8),
    "3x2 tiles": MeshSpec(24, 16, 8, 8),
    "dead cores": MeshSpec(16, 16, 8, 8, frozenset({Coord(1, 1), Coord(9, 3), Coord(4, 12), Coord(2, 2)})),
}


@pytest.mark.parametrize("name", MESHES)
def test_pipeline_over_tiles_gives_the_reference_tokens(name):
    placement = plan(CFG, TINY, MESHES[name], kv=KVReserve(32, 2))
    requests = [GenRequest((5, 6, 7), 12), GenRequest((100, 3), 9), GenRequest((9,), 14, stop_ids=(77,))]
    sampler = Sampler(temperature=0.9, top_k=30, seed=1)
    want, _ = generate_reference(CFG, W, requests, sampler)
    got, stats = LocalDecoder(CFG, W, placement).generate(requests, sampler)
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert [c.finish for c in got] == [c.finish for c in want]
    assert not any(placement.mesh.dead & set(r.cores()) for r in placement.layers)
    assert stats.tokens == sum(len(c.tokens) for c in want) and stats.wafer_tokens_per_s > 0


def test_request_beyond_kv_capacity_is_refused_before_it_starts():
    placement = plan(CFG, TINY, MESHES["2x2 tiles"], kv=KVReserve(32, 2))
    too_long = placement.kv_tokens + 1
    requests = [GenRequest((5,) * 4, too_long), GenRequest((6, 7), 5)]
    out, _ = LocalDecoder(CFG, W, placement).generate(requests, Sampler())
    assert out[0].finish.startswith("refused") and "KV positions" in out[0].finish and not out[0].tokens
    assert out[1].finish == "length" and len(out[1].tokens) == 5


def test_a_batch_of_prompt_tokens_equals_one_token_at_a_time():
    """Prefill: several positions of one request (and other requests) in one batch, causal attention."""
    region = Region(0, 0, 3, 2)
    arrays = pack_layer(CFG, W.layers[0], region)
    shards = [LayerShard(Decoding(CFG), region, arrays, KVCapacity(3, 16), Ledger(TINY)) for _ in "ab"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, shards[0].arrays["attn_norm"].shape[1])).astype(np.float32)
    slots, poss = np.array([0, 0, 0, 2, 2]), np.array([0, 1, 2, 0, 1])
    together = shards[0].forward(x, slots, poss)
    one_by_one = np.concatenate([shards[1].forward(x[b:b + 1], slots[b:b + 1], poss[b:b + 1]) for b in range(5)])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)


def test_region_across_tiles_is_refused_with_advice():
    mesh = MeshSpec(16, 16, 8, 8)
    setup = DecodeSetup(CFG, mesh, (Region(6, 0, 4, 2),) * 3, Region(0, 8, 4, 4), 16, 1)  # layers straddle
    with pytest.raises(PlacementError, match="spans 2 tiles.*inside one tile"):
        setup.stage_tiles()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_storage_equals_the_reference_on_rounded_weights(dtype):
    """Weights and K/V stored in 16 bits, computed in float32: the same tokens as the reference run on
    weights rounded the same way, and the plan books 2 bytes per weight."""
    embed = _round(W.embed, dtype)
    rounded = LlamaWeights(embed, _round(W.layers, dtype), _round(W.final_norm, dtype), embed)
    placement = plan(CFG, TINY, MESHES["2x2 tiles"], kv=KVReserve(32, 2), options=PlanOptions(dtype=dtype))
    requests = [GenRequest((5, 6, 7), 10), GenRequest((9,), 10)]
    want, _ = generate_reference(CFG, rounded, requests, Sampler())
    got, _ = LocalDecoder(CFG, W, placement).generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    f32 = plan_report(plan(CFG, TINY, MESHES["2x2 tiles"], kv=KVReserve(32, 2)))
    assert plan_report(placement).sram_max < f32.sram_max


def _round(value, dtype):
    if isinstance(value, tuple):
        return tuple(LayerWeights(**{name: _round(a, dtype) for name, a in lw.arrays().items()}) for lw in value)
    return to_f32(to_storage(value, dtype), dtype)
