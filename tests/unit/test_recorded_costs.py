"""Costs are recorded from what the layer's math does (waferrt.decode.net), not booked by hand: a layer whose math
does one more MeshGEMV records one more MeshGEMV -- its flops and its allreduce's messages -- on both
implementations of the interface, with no edit to any cost code; the estimator's closed form (decode.cost) then
no longer agrees with what the tiles recorded, and the tie test that compares them fails."""

from __future__ import annotations

import numpy as np
import pytest
from test_ties import test_the_estimators_token_is_what_the_tiles_recorded as tie

from waferrt.core.cost import allreduce_cost, flop_cycles, on_lines
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode import shards
from waferrt.decode.cost import Decoding
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.fabric.comm import Collectives
from waferrt.model import synthetic_llama, tiny_config

CFG = tiny_config()  # dim 64, hidden 128
REGION = Region(0, 0, 4, 2)  # 4 columns, 2 rows


def _one_more_gemv(monkeypatch) -> None:
    """The MLP with one more MeshGEMV (the gate/up product computed twice), patched into the block function."""
    mlp = shards.mlp

    def mlp_plus(net, cx, cy, w13, w2, h):
        net.gemv(cx, w13, h)  # the extra GEMV: (B, R, 2*hid_r), thrown away
        return mlp(net, cx, cy, w13, w2, h)

    monkeypatch.setattr(shards, "mlp", mlp_plus)


def _layer_ledger(fast: bool) -> Ledger:
    """One token through one layer of the tiny model on a WSE-2 4x2 region."""
    ledger = Ledger(WSE2)
    w = synthetic_llama(CFG, seed=0).layers[0]
    shard = shards.LayerShard(Decoding(CFG, coll=Collectives(fast=fast)), REGION, pack_layer(CFG, w, REGION),
                              (1, 8), ledger)
    x = Chunks(CFG.dim, 4).split(np.random.default_rng(0).standard_normal((1, CFG.dim)).astype(np.float32))
    shard.forward(x, np.arange(1), np.zeros(1, int))
    return ledger


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hop"])
def test_one_more_gemv_is_recorded_with_no_edit_to_cost_code(monkeypatch, fast):
    before = _layer_ledger(fast).by_op["layer"]
    _one_more_gemv(monkeypatch)
    after = _layer_ledger(fast).by_op["layer"]
    # w13 (256 x 64) over 4 columns x 2 rows: every core's block is 16 inputs x 128 outputs: 2 * 16 * 128 flops
    assert after.flops - before.flops == 4096
    # its partial sums (128 outputs of each of the 2 rows, float32) allreduced over the 4 columns of both rows
    reduce = on_lines(allreduce_cost(WSE2, "ktree", 4, 128 * 4, 2), 2)
    assert after.messages - before.messages == reduce.messages > 0
    assert after.cycles - before.cycles == pytest.approx(flop_cycles(WSE2, 4096) + reduce.cycles, rel=1e-9)


def test_the_tie_with_the_estimator_then_fails(monkeypatch):
    """The emulated decode's token (the tiles' ledgers) against the estimator's closed form: equal as the code is,
    apart by the extra GEMV once the math changes -- the tie test catches it."""
    tie("mesh", "float32", "layer")  # holds
    _one_more_gemv(monkeypatch)
    with pytest.raises(AssertionError, match="comparison failed"):
        tie("mesh", "float32", "layer")
