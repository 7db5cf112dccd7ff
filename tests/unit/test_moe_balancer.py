"""NI-Balancer on the mesh (no Ray): the routing histogram picks a swap, the swap's weights move at once
(a stall) or in steps while decoding goes on, and the tokens stay the reference's throughout."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY
from waferrt.decode.balancer import Swap, block_loads, plan_swap, swap_load
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.moe import MoELayerShard, pack_moe_layer
from waferrt.decode.moe_layout import expert_blocks
from waferrt.decode.pack import Chunks, pack_embed
from waferrt.decode.shards import EmbedShard
from waferrt.model import ReferenceModel, synthetic_llama, tiny_moe_config

CFG = tiny_moe_config(n_experts=4, top_k=1)
W = synthetic_llama(CFG, seed=3)
REGION = Region(0, 0, 8, 2)  # ER: two bands of one row, two experts each


def test_the_histogram_picks_the_swap_that_evens_the_blocks():
    blocks = expert_blocks(4, REGION, "er")
    assert blocks[0] == blocks[1] != blocks[2] == blocks[3]
    routed = np.array([10, 9, 1, 0])  # both hot experts share the first band
    assert block_loads(routed, blocks) == {blocks[0]: 19, blocks[2]: 1}
    swap = plan_swap(routed, blocks)
    assert swap is not None and {swap.a, swap.b} & {0, 1} and {swap.a, swap.b} & {2, 3}
    assert plan_swap(np.array([5, 1, 5, 1]), blocks) is None  # already even
    with pytest.raises(ValueError, match="two different experts"):
        Swap(1, 1)


def test_a_swap_crosses_the_links_between_the_blocks():
    a, b = Region(0, 0, 2, 1), Region(0, 2, 2, 1)
    load = swap_load(Region(0, 0, 2, 3), a, b, 100.0)
    assert load.bytes[2, :2].tolist() == [[100, 100], [100, 100]]
    assert load.bytes[3, 1:].tolist() == [[100, 100], [100, 100]]
    assert load.bytes[:2].sum() == 0 and load.hops == 2 and load.messages == 4


@pytest.mark.parametrize("steps", [0, 3])
def test_tokens_stay_the_references_during_and_after_a_migration(steps):
    ledger = Ledger(TINY)
    shards = [MoELayerShard(Decoding(CFG), REGION, pack_moe_layer(CFG, lw, REGION, "er"), KVCapacity(1, 24), ledger)
              for lw in W.layers]
    embed = EmbedShard(CFG, REGION, pack_embed(CFG, W.embed, W.final_norm, REGION), ledger)
    ref, chunks = ReferenceModel(CFG, W), Chunks(CFG.dim, REGION.w)
    cache, before, stall = ref.new_cache(), shards[0].blocks, None
    for pos, tok in enumerate([5, 17, 100, 3, 9, 44, 61, 2]):
        if pos == 2:
            stall = shards[0].migrate(Swap(0, 2), steps)
        x = chunks.split(ref.weights.embed[[tok]])
        for shard in shards:
            x = shard.forward(x, np.array([0]), np.array([pos]))
        np.testing.assert_allclose(embed.logits(x)[0], ref.step(tok, pos, cache), atol=1e-4, rtol=1e-4)
        moved = shards[0].blocks != before
        assert moved == (pos >= 2 + steps - (steps > 0))  # at once: from then on; in steps: after the last
    assert shards[0].blocks[0] == before[2] and shards[0].blocks[2] == before[0] and shards[0].migration is None
    if steps:
        assert stall.cycles == 0
    else:
        assert stall.cycles > 0 and ledger.by_op["migration"] == stall


def test_ni_balancer_moves_the_same_bytes_and_waits_less_than_at_once():
    from waferrt.decode.balancer import at_once_cost, step_cost
    from waferrt.decode.linkload import LinkLoad

    region = Region(0, 0, 8, 4)
    load = swap_load(region, Region(0, 0, 8, 1), Region(0, 2, 8, 1), 512.0)
    busy = LinkLoad(region)
    busy.bytes[0] = 1.0  # a phase that only uses the eastward links: the swap's (vertical) links are cold
    cold = step_cost(TINY, load, 8, [busy])
    assert cold.cycles == 0 and 8 * cold.link_bytes == pytest.approx(load.total())
    busy.bytes[2] = 1.0  # now it shares the southward links
    assert 0 < step_cost(TINY, load, 8, [busy]).cycles < at_once_cost(TINY, load).cycles


def test_a_migration_step_takes_each_link_in_the_phase_that_leaves_it_cold():
    """MoEntwine's NI-Balancer alternates between the attention's and the MoE's cold links: a part whose
    southward links are hot in one phase and northward ones in the other costs nothing; with both directions
    hot in one phase it waits behind them: its busiest link's 512/8 = 64 bytes at TINY's 4 B/cycle, 16 cycles."""
    from waferrt.decode.balancer import step_cost
    from waferrt.decode.linkload import LinkLoad

    region = Region(0, 0, 8, 4)
    load = swap_load(region, Region(0, 0, 8, 1), Region(0, 2, 8, 1), 512.0)
    south, north = LinkLoad(region), LinkLoad(region)
    south.bytes[2], north.bytes[3] = 1.0, 1.0
    assert step_cost(TINY, load, 8, [south]).cycles == step_cost(TINY, load, 8, [north]).cycles == 16
    assert step_cost(TINY, load, 8, [south, north]).cycles == 0
    north.bytes[2] = 1.0
    assert step_cost(TINY, load, 8, [south, north]).cycles == 16


def test_the_decode_balances_while_it_runs_and_keeps_the_reference_tokens():
    import dataclasses

    from waferrt.core.mesh import MeshSpec
    from waferrt.model import Sampler
    from waferrt.scheduler import KVReserve, plan
    from waferrt.serving import GenRequest, LocalDecoder, generate_reference

    config = tiny_moe_config(n_experts=4, top_k=1)
    w = synthetic_llama(config, seed=5)
    placement = dataclasses.replace(plan(config, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2)), balance=2)
    requests = [GenRequest((5, 6, 7), 12), GenRequest((9,), 12)]
    want, _ = generate_reference(config, w, requests, Sampler())
    dec = LocalDecoder(config, w, placement)
    got, _ = dec.generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    swaps = [sw for p in dec.programs.values() for sh in p.layers.values() for sw in sh.swaps]
    assert swaps  # some layer moved experts while decoding went on
