"""Costs are recorded from what the layer's math does (waferrt.decode.net), not booked by hand: a layer whose math
does one more MeshGEMV records one more MeshGEMV -- its flops and its allreduce's messages -- on both
implementations of the interface, with no edit to any cost code; the estimator's closed form (decode.cost) then
no longer agrees with what the tiles recorded, and the tie test that compares them fails. The prefill runs the
same block functions on its SquareNet: the same change records one more MeshGEMM there, and the prefill's tie
(decode.prefill.prefill_layer_cost) fails. Training's forward runs the same block functions (on its KernelNet): one
more pass over RMSNorm's values there is recorded, and training's forward tie (core.train_cost) fails; the extra
projection in the MLP is recorded there too."""

from __future__ import annotations

import numpy as np
import pytest
from test_prefill_layer import test_a_prefilled_layer_equals_the_reference_and_the_decode_continues as prefill_tie
from test_ties import test_the_estimators_token_is_what_the_tiles_recorded as tie
from test_train_ties import test_the_forward_on_the_mesh_is_the_hosts_and_books_its_closed_form as train_tie

from waferrt.core.cost import allreduce_cost, flop_cycles, on_lines
from waferrt.core.gemm_cost import GemmShape, gemm_cost, skew_cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY, WSE2
from waferrt.core.train_cost import TrainShape, block_forward_parts
from waferrt.decode import shards
from waferrt.decode.decoding import ELEMENTWISE_FLOPS, Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.prefill import prefill_layer, prefill_layer_cost
from waferrt.fabric.comm import Collectives
from waferrt.model import synthetic_llama, tiny_config
from waferrt.runtime import Wafer
from waferrt.training.forward import block_forward_mesh

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
                              KVCapacity(1, 8), ledger)
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


def _prefill_ledger() -> Ledger:
    """A prompt of 9 tokens through one layer of the tiny model by the prefill on a 4x4 region (its square)."""
    ledger, region = Ledger(TINY), Region(0, 0, 4, 4)
    shard = shards.LayerShard(Decoding(CFG), region, pack_layer(CFG, synthetic_llama(CFG, seed=0).layers[0], region),
                              KVCapacity(1, 16), ledger)
    x = np.random.default_rng(0).standard_normal((9, CFG.dim)).astype(np.float32)
    prefill_layer(shard, Chunks(CFG.dim, 4).split(x), slot=0)
    return ledger


def test_one_more_gemv_in_the_prefill_is_recorded_and_its_tie_fails(monkeypatch):
    """The same extra projection in the MLP, run by the prefill's SquareNet: one more MeshGEMM recorded, no cost
    code edited; the prefill's closed form then disagrees and its tie test fails."""
    before = _prefill_ledger().by_op["prefill"]
    assert before == prefill_layer_cost(TINY, Decoding(CFG), Region(0, 0, 4, 4), 9)
    prefill_tie(Region(0, 0, 4, 4), 9)  # holds
    _one_more_gemv(monkeypatch)
    after = _prefill_ledger().by_op["prefill"]
    # the slab (9 x 64) times w13's (64 x 256) on the 4x4 square: every core's A block 3 x 16 (9 tokens, 64 in,
    # over 4), B block 16 x 64 (256 out over 4); MeshGEMM's 4 steps each multiply them: 4 * 2 * 3 * 16 * 64
    assert after.flops - before.flops == 24576
    extra = skew_cost(TINY, 4, 3 * 16 * 4) + gemm_cost(TINY, "meshgemm", GemmShape(9, 64, 256, 4, 4), "float32")
    assert extra.flops == 24576 and after.messages - before.messages == extra.messages > 0
    assert after.cycles - before.cycles == pytest.approx(extra.cycles, rel=1e-9)
    with pytest.raises(AssertionError):
        prefill_tie(Region(0, 0, 4, 4), 9)


def _train_forward_ops() -> dict:
    """What training's forward of one sequence of 8 tokens of the tiny model on an 8x8 square records, by op."""
    x = np.random.default_rng(3).standard_normal((8, CFG.dim)).astype(np.float32)
    with Wafer(spec="tiny", mesh=(8, 8), tile=(4, 4), backend="local") as wafer:
        block_forward_mesh(wafer, CFG, synthetic_llama(CFG, seed=0).layers[0], x)
        return wafer.cost().by_op


def test_one_more_gemv_in_trainings_forward_is_recorded(monkeypatch):
    """The MLP's extra gate/up projection, patched into the block function, runs in training's forward too (its
    KernelNet's projection): every core's A block is 1 token x 8 features (8 tokens, 64 features over 8), gate's
    and up's B blocks 8 x 16 (128 outputs over 8); MeshGEMM's 8 steps each multiply them, for both parts:
    2 x 8 x 2 * 1 * 8 * 16 = 4096 flops more than the closed form's, and one more skew of the 1 x 8 block."""
    parts = block_forward_parts(TINY, CFG, TrainShape(1, 8), 8, ELEMENTWISE_FLOPS)
    _one_more_gemv(monkeypatch)
    got = _train_forward_ops()
    assert got["meshgemm"].flops - parts["meshgemm"].flops == 4096
    assert got["relayout"].messages - parts["relayout"].messages == skew_cost(TINY, 8, 8 * 4).messages > 0


def test_one_more_rmsnorm_pass_in_trainings_forward_is_recorded_and_its_tie_fails(monkeypatch):
    """RMSNorm's element-wise work done twice, patched into the block function: training's forward (one sequence
    of 8 tokens of the tiny model on an 8x8 square) records it in its two RMSNorms, no cost code edited."""
    def rmsnorm_ops() -> int:
        return _train_forward_ops()["rmsnorm"].flops

    before = rmsnorm_ops()
    train_tie((8,))  # holds
    norm = shards.mesh_rmsnorm

    def twice(net, comm, x, w, n):
        net.elementwise(comm, "rmsnorm", x)  # the extra pass
        return norm(net, comm, x, w, n)

    monkeypatch.setattr(shards, "mesh_rmsnorm", twice)
    # every core's block: 1 token (8 over 8 rows) x 8 features (64 over 8 columns), 4 flops each, in two RMSNorms
    assert rmsnorm_ops() - before == 2 * 4 * 1 * 8
    with pytest.raises(AssertionError):
        train_tie((8,))
