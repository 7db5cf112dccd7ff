"""Experts on the mesh (no Ray): the expert mappings, an MoE layer's shard against the reference, the
all-to-all's link loads against the ledger, and the whole decode on the loop fabric under every mapping."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.cost import alltoall_cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.layout import layer_booking, most_bytes
from waferrt.decode.linkload import LinkLoad, block_patterns
from waferrt.decode.moe import MoELayerShard, pack_moe_layer
from waferrt.decode.moe_layout import MAPPINGS, expert_blocks, expert_core_bytes, expert_grid, expert_layouts
from waferrt.decode.pack import Chunks, pack_embed
from waferrt.decode.shards import EmbedShard
from waferrt.fabric.comm import Collectives
from waferrt.model import ReferenceModel, Sampler, synthetic_llama, tiny_moe_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_moe_config(n_experts=4, top_k=2)
W = synthetic_llama(CFG, seed=0)


@pytest.mark.parametrize("w,h", [(8, 4), (5, 3), (16, 8), (1, 1), (3, 7)])
@pytest.mark.parametrize("mapping", MAPPINGS)
def test_the_blocks_cut_the_region_and_every_expert_has_one(w, h, mapping):
    region = Region(2, 1, w, h)
    blocks = expert_blocks(8, region, mapping)
    distinct = set(blocks)
    assert len(blocks) == 8 and sum(b.size for b in distinct) == region.size
    assert all(region.x0 <= b.x0 and b.x0 + b.w <= region.x0 + w and region.y0 <= b.y0 and b.y0 + b.h <= region.y0 + h
               for b in distinct)
    g = expert_grid(8, region, mapping)
    assert g.gx * g.gy * g.per_block == 8 and len(distinct) == g.gx * g.gy
    if mapping == "er":
        assert all(b.w == w for b in distinct)  # bands of whole rows: every block holds full tokens


def test_naive_blocks_are_square_ish_and_er_bands_are_rows():
    region = Region(0, 0, 29, 16)
    assert expert_grid(8, region, "naive") == (g := expert_grid(8, region, "naive")) and (g.gx, g.gy) == (4, 2)
    assert (expert_grid(8, region, "er").gx, expert_grid(8, region, "er").gy) == (1, 8)
    assert (expert_grid(8, Region(0, 0, 29, 4), "er").gy, expert_grid(8, Region(0, 0, 29, 4), "er").per_block) == (4, 2)


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("shared", [0, 16])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_an_moe_layer_on_cores_equals_the_reference(mapping, shared, fast):
    config = tiny_moe_config(n_experts=4, top_k=2, shared_hidden_dim=shared)
    w = synthetic_llama(config, seed=1)
    region, coll, ledger = Region(0, 0, 8, 4), Collectives("ktree", 2, fast), Ledger(TINY)
    shards = [MoELayerShard(Decoding(config, coll=coll), region, pack_moe_layer(config, lw, region, mapping),
                            KVCapacity(2, 24), ledger)
              for lw in w.layers]
    embed = EmbedShard(config, region, pack_embed(config, w.embed, w.final_norm, region), ledger, coll)
    ref = ReferenceModel(config, w)
    cache = ref.new_cache()
    for pos, tok in enumerate([5, 17, 100, 3, 9]):
        want = ref.step(tok, pos, cache)
        x = embed.lookup(np.array([tok]))
        for shard in shards:
            x = shard.forward(x, np.array([1]), np.array([pos]))
        np.testing.assert_allclose(embed.logits(x)[0], want, atol=1e-4, rtol=1e-4)
    assert sum(s.routed.sum() for s in shards) == 5 * config.top_k * config.n_layers


def test_the_ledger_books_what_the_links_carried():
    region = Region(0, 0, 8, 4)
    ledger = Ledger(TINY)
    shard = MoELayerShard(Decoding(CFG), region, pack_moe_layer(CFG, W.layers[0], region, "naive"),
                          KVCapacity(4, 24), ledger)
    x = Chunks(CFG.dim, 8).split(np.random.default_rng(0).standard_normal((3, CFG.dim), dtype=np.float32))
    with ledger.op("layer"):
        shard._ffn(x)
    booked = sum(cost.link_bytes for cost in shard.booked.values())
    assert booked == sum(alltoall_cost(TINY, load).link_bytes for load in shard.traffic.values())
    pieces = {name: load.total() for name, load in shard.traffic.items()}
    assert pieces["dispatch"] > 0 and pieces["combine"] > pieces["dispatch"]  # the combine also goes down the columns
    assert booked == pytest.approx(sum(pieces.values()))
    assert ledger.by_op["layer"].link_bytes >= booked


def test_a_token_reaches_a_band_without_a_hop_and_a_narrow_block_along_its_rows():
    region = Region(0, 0, 8, 4)
    band, corner = Region(0, 1, 8, 1), Region(4, 2, 4, 2)
    there, back = block_patterns(CFG.dim, region, band)
    assert there.total() == 0 and back.total() == 0 and there.messages == 0
    there, back = block_patterns(CFG.dim, region, corner)
    # every block row takes all of dim into its 4 columns: the 4 region columns outside send 8 values each
    assert there.bytes[0].sum() > 0 and there.bytes[2:].sum() == 0 and there.hops == 4
    assert there.total() == back.total() and np.array_equal(back.bytes[1][:, 1:], there.bytes[0][:, :-1])
    assert 0 < there.cold_share() < 1 and LinkLoad(region).cold_share() == 1.0


def test_the_booking_holds_the_experts_of_any_mapping():
    region = Region(0, 0, 8, 4)
    most = expert_core_bytes(CFG, region)
    needs = [expert_grid(4, region, m).per_block * sum(lay.max_block_bytes() for lay in expert_layouts(CFG, b).values())
             for m in MAPPINGS for b in expert_blocks(4, region, m)]
    assert max(needs) == most
    total = 3 * CFG.n_experts * CFG.hidden_dim * CFG.dim * 4
    assert total / region.size <= most  # at least an even share on every core
    assert most_bytes(layer_booking(CFG, region, 16, 2)) > most


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_the_decode_on_tiles_gives_the_reference_tokens(mapping):
    mesh = MeshSpec(16, 16, 8, 8)
    placement = dataclasses.replace(plan(CFG, TINY, mesh, kv=KVReserve(32, 2)), experts=mapping)
    requests = [GenRequest((5, 6, 7), 8), GenRequest((9,), 8)]
    want, _ = generate_reference(CFG, W, requests, Sampler())
    got, _ = LocalDecoder(CFG, W, placement).generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert {r.w for r in placement.layers} != {1}  # the experts had columns to spread over


def test_the_column_combine_carries_each_partial_sum_once_per_link():
    from waferrt.decode.linkload import column_combine

    region = Region(0, 0, 3, 5)
    load = column_combine(region, np.array([False, True, True, False, False]), np.array([8.0, 4.0, 4.0]))
    assert load.bytes[2, :, 0].tolist() == [0, 8, 8, 8, 0]  # down from rows 1..3 (row 4 has no south link)
    assert load.bytes[3, :, 0].tolist() == [0, 8, 8, 0, 0]  # up from rows 1..2
    assert load.hops == 3 and load.messages == 5 * 3 and load.total() == 16 * 5


@pytest.mark.parametrize("w,h,batch", [(8, 4, 1), (8, 4, 3), (5, 3, 2), (1, 1, 1), (4, 8, 2)])
@pytest.mark.parametrize("shared", [0, 16])
@pytest.mark.parametrize("mapping", MAPPINGS)
def test_an_moe_layer_books_its_closed_form(w, h, batch, shared, mapping):
    """A zero router picks experts 0..top_k-1 for every token: the closed forms' typical token, on the expert
    mapping the Decoding names."""
    from waferrt.decode.cost import layer_decode_cost
    from waferrt.decode.decoding import Decoding

    config = tiny_moe_config(n_experts=4, top_k=2, shared_hidden_dim=shared)
    lw = dataclasses.replace(synthetic_llama(config, seed=2).layers[0], router=np.zeros((4, config.dim), np.float32))
    region, ledger = Region(0, 0, w, h), Ledger(TINY)
    shard = MoELayerShard(Decoding(config), region, pack_moe_layer(config, lw, region, mapping),
                          KVCapacity(batch, 20), ledger)
    chunks = Chunks(config.dim, w)
    for pos in range(3):
        ledger.clear()
        x = chunks.split(np.random.default_rng(pos).standard_normal((batch, config.dim)).astype(np.float32))
        shard.forward(x, np.arange(batch), np.full(batch, pos))
        dec = Decoding(config, experts=mapping)
        assert ledger.by_op["layer"] == layer_decode_cost(TINY, dec, region, pos + 1, batch,
                                                          moving=pos % w)


@pytest.mark.parametrize("shared", [0, 16])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_estimators_sram_closed_form_is_what_an_moe_region_books(shared, dtype):
    from waferrt.decode.layout import layer_core_bytes
    from waferrt.estimator import wafer
    from waferrt.scheduler.types import Workload

    config = tiny_moe_config(n_experts=4, top_k=2, shared_hidden_dim=shared)
    for w, h in [(1, 1), (8, 4), (5, 3), (16, 8), (3, 2)]:
        shape = wafer.Shape(w, h)
        work = Workload(config, KVReserve(64, 2), dtype)
        assert wafer.layer_core_bytes(work, shape) == layer_core_bytes(config, shape.region(), 64, 2, dtype)


def test_an_moe_regions_expert_bytes_by_hand():
    """The most expert bytes any mapping puts on a core of a 7x5 Mixtral region (decode.moe_layout's closed
    form), float16. naive: 4x2 blocks of 2, 2, 2, 1 columns and 3, 2 rows, one expert each; the 1x2 block
    holds 3 matrices of cdiv(14336, 2) x 4096 = 7168 x 4096 -> 176,160,768 bytes, the most (the 2x3 ones
    4779 x 2048 -> 58,724,352). er: 4 bands of whole rows (2, 1, 1, 1), two experts each; a 1-row band
    2 x 3 x 14336 x cdiv(4096, 7) = 586 -> 100,810,752 bytes. What the layouts' largest blocks hold."""
    from waferrt.model.zoo import MODELS

    mixtral, region = MODELS["mixtral-8x7b"].config, Region(0, 0, 7, 5)
    assert expert_core_bytes(mixtral, region, "float16") == 176_160_768
    needs = {m: [expert_grid(8, region, m).per_block * sum(lay.max_block_bytes() for lay in
                                                           expert_layouts(mixtral, b, "float16").values())
                 for b in expert_blocks(8, region, m)] for m in MAPPINGS}
    assert (min(needs["naive"]), max(needs["naive"]), max(needs["er"])) == (58_724_352, 176_160_768, 100_810_752)
