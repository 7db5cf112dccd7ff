"""The decode's closed forms equal what the emulator books, exactly: every field of every Cost.

- one layer region (``LayerShard.forward``) and the head (``EmbedShard.logits``) with a Ledger, over
  region shapes, micro-batch sizes and K/V positions (the K/V shift moves ``pos % cols`` columns);
- whole decodes of the tile programs (``LocalDecoder``, no Ray): the cycles of every stage run the tiles
  book, and what each token takes alone, against ``step_cycles`` -- on tiny meshes and on SmolLM2's
  default wse2 mesh;
- the planner's report (``plan_report``) gives the cycles per token the emulator books for one request.
"""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.cost import total
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode.cost import head_decode_cost, layer_decode_cost, layer_decode_parts, step_cycles
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_embed, pack_layer
from waferrt.decode.shards import EmbedShard, LayerShard
from waferrt.decode.stage import chain
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, PlanOptions, Strategy, default_mesh, plan, plan_report
from waferrt.serving import GenRequest, LocalDecoder

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


@pytest.mark.parametrize("w,h,kv_tokens,batch", [(4, 3, 20, 1), (4, 3, 20, 3), (1, 1, 8, 1), (5, 2, 33, 2),
                                                  (8, 8, 40, 4), (2, 5, 9, 1)])
def test_a_layer_books_its_closed_form(w, h, kv_tokens, batch):
    region, ledger = Region(0, 0, w, h), Ledger(TINY)
    arrays = pack_layer(CFG, W.layers[0], region, "float32")
    shard = LayerShard(Decoding(CFG), region, arrays, KVCapacity(batch, kv_tokens), ledger)
    chunks = Chunks(CFG.dim, w)
    for pos in range(4):  # the K/V shift moves pos % w columns: none at pos 0, then 1, 2, ...
        ledger.clear()
        x = chunks.split(np.random.default_rng(pos).standard_normal((batch, CFG.dim)).astype(np.float32))
        shard.forward(x, np.arange(batch), np.full(batch, pos))
        # attention runs over the pos + 1 positions each request now holds
        assert ledger.by_op["layer"] == layer_decode_cost(TINY, Decoding(CFG), region, pos + 1, batch, pos % w)
    ledger.clear()
    EmbedShard(CFG, region, pack_embed(CFG, W.embed, W.final_norm, region, "float32"), ledger).logits(x)
    assert ledger.by_op["head"] == head_decode_cost(TINY, Decoding(CFG), region, batch)


def test_layer_parts_name_every_piece_and_sum_to_the_layer():
    parts = layer_decode_parts(WSE2, Decoding(SMOLLM2_135M), Region(0, 0, 30, 12), 512, 2)
    assert {c for _, c, _ in parts} == {"gemv", "allreduce", "attention", "elementwise"}
    dec = Decoding(SMOLLM2_135M)
    assert total(c for _, _, c in parts) == layer_decode_cost(WSE2, dec, Region(0, 0, 30, 12), 512, 2)
    by = {n: c for n, _, c in parts}
    # the K/V shift is one hop, one routing stage of K and V (and the position word) of both requests
    assert (by["kv.shift"].hops, by["kv.shift"].stages) == (1, 1)
    assert by["kv.shift"].link_bytes == 29 * 12 * 2 * 2 * 3 * (2 * 3 + 1) * 4  # 29 columns x 12 rows move


def _check_decode(dec: LocalDecoder, requests: int, tokens: int = 3) -> list:
    """Fresh one-token prompts decoded `tokens` deep: a micro-batch's tokens share a position k (the caches
    hold k entries, so k % cols columns move); every stage run books step_cycles' figure for its size, and
    every token's cycles alone are step_cycles' for a micro-batch of one."""
    p, config = dec.placement, dec.placement.config
    stages = dec.setup.stages()
    _, stats = dec.generate([GenRequest((5 + i,), tokens) for i in range(requests)], Sampler())
    for r in stats.runs:
        (pos,) = {it.pos for it in r.items}
        moving = pos % p.layers[0].w
        want = step_cycles(p.spec, Decoding(config), stages, pos + 1, [len(r.items)], moving)  # pos + 1 held
        assert r.cycles == pytest.approx(want[(r.stage, 0)], rel=1e-12), (r.mb, r.stage)
        alone = step_cycles(p.spec, Decoding(config), stages, pos + 1, [1], moving)[(r.stage, 0)]
        assert all(it.alone == pytest.approx(alone, rel=1e-12) for it in r.items), (r.mb, r.stage)
    return stats.runs


@pytest.mark.parametrize("mesh,requests,group", [(MeshSpec(16, 16, 8, 8), 1, 1), (MeshSpec(16, 16, 8, 8), 4, 1),
                                                 (MeshSpec(24, 16, 8, 8), 3, 1), (MeshSpec(16, 16, 8, 8), 3, 2),
                                                 (MeshSpec(16, 16, 8, 8), 3, 3)])
def test_a_decode_books_the_closed_forms(mesh, requests, group):
    """Layer-pipelined regions, groups of 2 layers per region and one region for all 3 (tensor): the layers
    stacked on a region hand over nothing between them."""
    p = plan(CFG, TINY, mesh, kv=KVReserve(32, 4), options=PlanOptions(strategy=Strategy(group, CFG.n_layers)))
    assert len(set(p.layers)) == -(-CFG.n_layers // group)
    _check_decode(LocalDecoder(CFG, W, p), requests)


def test_smollm2_on_its_default_mesh_books_the_closed_forms_the_planner_uses():
    kv = KVReserve(512, 8)
    p = plan(SMOLLM2_135M, WSE2, default_mesh(SMOLLM2_135M, WSE2, kv), kv=kv)
    runs = _check_decode(LocalDecoder(SMOLLM2_135M, synthetic_llama(SMOLLM2_135M, seed=0), p), 1, tokens=3)
    assert {r.items[0].pos for r in runs} == {0, 1, 2}
    stages = chain(p.embed, p.layers, p.embed)
    full = sum(step_cycles(p.spec, Decoding(SMOLLM2_135M), stages, p.kv_tokens, [1]).values())
    assert full == pytest.approx(plan_report(p).step_cycles, rel=1e-12)  # the planner times the same forms
