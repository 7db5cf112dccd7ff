"""The prefill's layout moves carried (waferrt.decode.transport, the Moves of waferrt.decode.prefill_plan): hop by
hop and at once give the same buffers; the hops' bytes on every link are relayout.route's of the Move and the
closed forms of decode.relayout (weights_load, heads_load, kv_load, kv_read_load), link for link; a message
that leaves its route's end lands in another core's block."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.mesh import Region
from waferrt.decode.kvcache import PromptChunk, kv_columns
from waferrt.decode.pack import pack_layer
from waferrt.decode.prefill_plan import GEMMS, cache_shape, head_moves, read_move, weight_moves
from waferrt.decode.relayout import heads_load, kv_load, kv_read_load, weights_load
from waferrt.decode.transport import Holder, Move, carry, mirrored, walk
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.config import LlamaConfig

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
REGIONS = [Region(0, 0, 4, 4), Region(2, 1, 5, 3), Region(0, 0, 3, 6), Region(0, 0, 7, 2)]


def _same(got, want) -> None:
    np.testing.assert_array_equal(got.bytes, want.bytes)
    assert (got.messages, got.hops) == (want.messages, want.hops)


def _sum(moves: list[Move]):
    out = moves[0].load(4)
    for m in moves[1:]:
        out.add(m.load(4))
    return out


def _carried_both_ways(move: Move, buf: np.ndarray) -> None:
    """Hop by hop = at once, and the hops' link bytes = the route's."""
    np.testing.assert_array_equal(carry(move, buf, True), carry(move, buf))
    _same(walk(move, 4)[1], move.load(4))


@pytest.mark.parametrize("region", REGIONS, ids=lambda r: f"{r.w}x{r.h}")
def test_the_weights_carried_hop_by_hop_book_the_closed_form(region):
    arrays = pack_layer(CFG, W.layers[0], region)
    plan = weight_moves(CFG, region, tuple(arrays[key].shape for _, key, _ in GEMMS))
    for wm in plan:
        _carried_both_ways(wm.into, arrays[wm.key])
        _carried_both_ways(wm.back, carry(wm.into, arrays[wm.key]))
    _same(_sum([wm.into for wm in plan]), weights_load(CFG, region, 1, 4))
    _same(_sum([wm.back for wm in plan]), mirrored(weights_load(CFG, region, 1, 4)))  # back: the cost of in


@pytest.mark.parametrize("chunk", [PromptChunk(0, 7), PromptChunk(0, 16), PromptChunk(5, 9), PromptChunk(12, 3)],
                         ids=lambda c: f"{c.start}+{c.tokens}")
@pytest.mark.parametrize("region", REGIONS, ids=lambda r: f"{r.w}x{r.h}")
def test_the_qkv_product_carried_into_the_heads_and_the_cache_books_the_closed_forms(region, chunk):
    moves = head_moves(CFG, region, chunk)
    product = np.random.default_rng(chunk.tokens).standard_normal(moves.q.source.shape).astype(np.float32)
    for move in (moves.q, moves.kv, moves.cache):
        _carried_both_ways(move, product)
    _same(_sum([moves.q, moves.kv]), heads_load(CFG, region, chunk, 4))
    if chunk.start == 0:  # later chunks' kv_load also moves the cached entries east: the cache's own shifts
        _same(moves.cache.load(4), kv_load(CFG, region, chunk, 1, 4))
    else:
        read = read_move(CFG, region, chunk)
        cached = np.random.default_rng(0).standard_normal(read.source.shape).astype(np.float32)
        _carried_both_ways(read, cached)
        _same(read.load(4), kv_read_load(CFG, region, chunk, 1, 4))
        assert read.source.shape == cache_shape(CFG, region, kv_columns(chunk.start, region.w))


def test_the_heads_move_by_hand():
    """On 2x2 cores, 2 tokens, one head of 2 dims each for Q, K, V: the product's 6 columns lie 3 per core column
    (q0 q1 k0 | k1 v0 v1); each head's 2 dims lie one per core column. Per row, q1 goes one hop east, v0 one hop
    west, the others stay: 4 bytes each way, one message each way; the token rows stay put."""
    config = LlamaConfig(dim=2, hidden_dim=2, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=4)
    load = heads_load(config, Region(0, 0, 2, 2), PromptChunk(0, 2), 4)
    assert load.bytes[0].tolist() == [[4, 0], [4, 0]] and load.bytes[1].tolist() == [[0, 4], [0, 4]]
    assert load.bytes[2:].sum() == 0 and (load.messages, load.hops) == (4, 1)


def test_a_message_is_written_where_its_last_hop_leaves_it():
    region = Region(0, 0, 3, 2)
    source, target = Holder((2, 3, 1), (2, 3)), Holder((2, 3, 1), (2, 3))
    move = Move(region, source, target, np.array([0, 5]), np.array([5, 0]))  # (0,0) <-> (1,2)
    buf = np.array([[[1.0], [0], [0]], [[0], [0], [2.0]]])
    got = carry(move, buf, hop_by_hop=True)
    assert got[1, 2, 0] == 1 and got[0, 0, 0] == 2
    arrive, load = walk(move)
    assert arrive.tolist() == [5, 0] and load.hops == 3 and load.messages == 2
