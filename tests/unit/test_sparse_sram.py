"""Sparse attention's top-K lists in the SRAM budget: decode.topk.buffer_bytes is what a core of the row_topk
kernel holds (its own list and a neighbour's), the tiles book it per layer region (decode.layout.topk_booking
in stage_sram: once a region, nothing when every key is kept), a core that cannot hold it overflows naming it,
and the estimator's longest context counts it (estimator.wafer.shape_kv_capacity under the mode)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from waferrt.core.arith import cdiv
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.core.sram import SramBook, SramOverflow
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.decode.topk import TopKRow, buffer_bytes, local_select
from waferrt.estimator.estimate import Objective, estimate
from waferrt.estimator.sparse_estimate import sparse_estimate
from waferrt.fabric.loop import simulate
from waferrt.model import AttentionMode, tiny_config
from waferrt.model.zoo import model_by_name
from waferrt.scheduler import PlanOptions, plan
from waferrt.scheduler.types import KVReserve

CFG = tiny_config()


@pytest.mark.parametrize(("n", "m", "heads", "keep"), [(4, 6, 3, 5), (3, 2, 2, 4), (1, 8, 1, 8)])
def test_the_buffer_is_what_a_core_of_the_kernel_holds(n, m, heads, keep) -> None:
    mesh = MeshSpec(n, 2, n, 2)
    scores = np.random.default_rng(n).standard_normal((2, n, heads, m)).astype(np.float32)
    mine, _ = simulate(mesh, TINY, mesh.region, lambda ctx, scores: local_select(ctx, scores, keep), scores=scores)
    # a core's own list, and the one its neighbour streams in (merge_round receives a list of the same shape)
    assert buffer_bytes(TopKRow(n, m, heads, keep)) == 2 * mine[0, 0].nbytes == 2 * heads * keep * 8


def setup(mode: AttentionMode, layers=None) -> DecodeSetup:
    layers = layers or tuple(Region(0, 0, 4, 4) if i < 2 else Region(4, 0, 4, 4) for i in range(CFG.n_layers))
    return DecodeSetup(CFG, MeshSpec(8, 8, 8, 8), layers, Region(0, 4, 8, 4), 32, 2, attention=mode)


def test_the_tiles_book_the_top_k_lists_once_a_layer_region() -> None:
    sparse = setup(AttentionMode(keep=5))
    booked = {name: nbytes for s in range(len(sparse.stages())) for name, (_, nbytes) in stage_sram(sparse, s).items()}
    want = buffer_bytes(TopKRow(4, cdiv(32, 4), CFG.n_heads, 5))
    assert np.all(booked["layer0.topk"] == want) and np.all(booked["layer2.topk"] == want)
    assert "layer1.topk" not in booked  # stacked on layer 0's region: one set of lists, as one scratch
    dense = {name for s in range(len(sparse.stages())) for name in stage_sram(setup(AttentionMode()), s)}
    every_key = {name for s in range(len(sparse.stages())) for name in stage_sram(setup(AttentionMode(keep=32)), s)}
    assert set(booked) - dense == {"layer0.topk", "layer2.topk"} and every_key == dense


def test_a_core_that_cannot_hold_the_lists_overflows_naming_them() -> None:
    st = setup(AttentionMode(keep=31))
    bookings = [b for s in range(len(st.stages())) for b in stage_sram(st, s).items() if b[1][0] == Region(0, 0, 4, 4)]
    need = int(sum(np.broadcast_to(nbytes, (4, 4)) for _, (_, nbytes) in bookings).max())  # the fullest core
    book = SramBook(Region(0, 0, 4, 4), need - 1)
    with pytest.raises(SramOverflow, match="topk"):
        for name, (region, nbytes) in sorted(bookings, key=lambda b: b[0].endswith("topk")):
            book.reserve(name, region, nbytes)


def test_the_longest_context_that_fits_counts_the_lists() -> None:
    """SmolLM2 at 8K on WSE-2: sparse:8's lists (1,152 bytes a core) leave room; sparse:4096's (589,824) fit on
    no core, so only contexts of at most 4,096 positions (every key kept: no top-K) fit."""
    config, _ = model_by_name("smollm2-135m")
    est = estimate(config, WSE2, WSE2.full_mesh, KVReserve(8192, 1), "float16", Objective("latency"))
    small, large = (sparse_estimate(est, AttentionMode(keep=k)) for k in (8, 4096))
    assert small.dense_longest == large.dense_longest == est.kv_tokens_per_request
    assert large.longest_context == 4096 < small.longest_context <= est.kv_tokens_per_request


def book_every_stage(setup: DecodeSetup, sram: int) -> None:
    """What the tiles book at start (actors/tile.py): every stage's stage_sram on its tile's SramBook."""
    books = {}
    for s, tile in enumerate(setup.stage_tiles()):
        book = books.setdefault(tile, SramBook(setup.mesh.tile_region(tile), sram))
        for name, (region, nbytes) in stage_sram(setup, s).items():
            book.reserve(name, region, nbytes)


def test_the_planner_leaves_room_for_the_lists_the_tiles_book() -> None:
    """The planner fills a region's cores with K/V (its kv_tokens grow to what fits): planned dense, the lists
    do not fit; planned for sparse:5 (PlanOptions.attention: scheduler.budget.layer_bytes counts them), the tiles
    book everything."""
    mode = AttentionMode(keep=5)
    dense = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2))
    with pytest.raises(SramOverflow, match="topk"):
        book_every_stage(replace(DecodeSetup.from_placement(dense), attention=mode), TINY.sram_bytes)
    sparse = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 2), options=PlanOptions(attention=mode))
    book_every_stage(replace(DecodeSetup.from_placement(sparse), attention=mode), TINY.sram_bytes)
    assert (sparse.layers[0], sparse.kv_tokens) != (dense.layers[0], dense.kv_tokens)  # planned otherwise
