"""The prefill's layout moves (waferrt.decode.relayout) tied to where the emulator holds every value: each
weight, K and V value labelled with its own number, found in the decode's packed blocks, in the MeshGEMM's B
blocks (kernels.gemm.place), in the QKV product's C blocks and the attention's (kernels.gemm.spread), in the
checked cache's own columns (MeshKVCache) -- routed value by value, the closed forms' LinkLoads are equal
link for link, and the router books every hop."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity, PromptChunk, kv_columns
from waferrt.decode.layout import layer_layouts
from waferrt.decode.linkload import LinkLoad
from waferrt.decode.pack import Chunks, blocks_of, pack_layer
from waferrt.decode.prefill import prefill_layer
from waferrt.decode.relayout import kv_load, kv_read_load, route, weights_load
from waferrt.decode.shards import LayerShard
from waferrt.fabric.comm import Collectives
from waferrt.kernels.gemm import Grid, place, spread
from waferrt.model import synthetic_llama, tiny_config

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
REGIONS = [Region(0, 0, 4, 4), Region(2, 1, 5, 3), Region(0, 0, 3, 6), Region(0, 0, 7, 2)]


def _homes(blocks: np.ndarray) -> dict[int, tuple[int, int]]:
    """Value number -> (y, x) of the core whose block (blocks (rows, cols, ...)) holds it (0: padding)."""
    out = {}
    for y, x in np.ndindex(*blocks.shape[:2]):
        out.update({int(v): (y, x) for v in np.unique(blocks[y, x]) if v})
    return out


def _routed(region: Region, moves: list[tuple[tuple[int, int], tuple[int, int]]]):
    src, dst = (np.array([m[i] for m in moves]).reshape(-1, 2) for i in (0, 1))
    return route(region, src, dst, np.full(len(moves), 4.0))


def _assert_same(got, want) -> None:
    np.testing.assert_array_equal(got.bytes, want.bytes)
    assert (got.messages, got.hops) == (want.messages, want.hops)


@pytest.mark.parametrize("region", REGIONS, ids=lambda r: f"{r.w}x{r.h}")
def test_the_weights_move_is_every_value_from_its_decode_block_to_its_gemm_block(region):
    lw, n = W.layers[0], 1
    numbered = {}
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        shape = getattr(lw, name).shape
        numbered[name] = np.arange(n, n + np.prod(shape), dtype=np.float32).reshape(shape)
        n += numbered[name].size
    arrays = pack_layer(CFG, replace(lw, **numbered), region)
    decode = {}
    for key, out_over in (("wqkv", "y"), ("wo", "x"), ("w13", "y"), ("w2", "x")):
        decode.update(_homes(blocks_of(arrays[key], out_over, region)))
    s = min(region.w, region.h)
    grid = Grid.of(Region(0, 0, s, s))
    want, values = LinkLoad(region), 0
    for mats in (("wq", "wk", "wv"), ("wo",), ("w_gate", "w_up"), ("w_down",)):  # a message per matrix and pair
        b = np.concatenate([numbered[m] for m in mats]).T
        _, pb = place("meshgemm", grid, Region(0, 0, s, s), np.zeros((1, b.shape[0]), np.float32), b)
        moves = [(decode[v], yx) for v, yx in _homes(pb).items()]
        want.add(_routed(region, moves))
        values += len(moves)
    assert values == n - 1
    _assert_same(weights_load(CFG, region, 1, 4), want)


def _cache_columns(shard, slot: int) -> dict[int, int]:
    cores = shard.kv.layout  # kv_layouts.CoreEntries: every core's own entries
    return {int(cores.pos[slot, m, c]): c for c in range(shard.kv.cols) for m in range(cores.count[slot, c])}


@pytest.mark.parametrize("chunks", [(7,), (5, 9), (12, 3)], ids=str)
@pytest.mark.parametrize("region", REGIONS[:3], ids=lambda r: f"{r.w}x{r.h}")
def test_the_kv_moves_are_every_value_from_its_block_to_its_cache_place_and_back(region, chunks):
    """A prompt prefilled in chunks on the checked cache: each chunk's K/V from the QKV product's C blocks
    to the cache's columns, the cached ones east to their new columns, and read into the attention's."""
    dec = Decoding(CFG, coll=Collectives(fast=False))
    shard = LayerShard(dec, region, pack_layer(CFG, W.layers[0], region), KVCapacity(2, 32), Ledger(TINY))
    x = np.random.default_rng(0).standard_normal((sum(chunks), CFG.dim)).astype(np.float32)
    split = Chunks(CFG.dim, region.w).split
    s, kvd, hd = min(region.w, region.h), CFG.kv_dim, CFG.head_dim
    grid, rows = Grid.of(Region(0, 0, s, s)), layer_layouts(CFG, region)["wk"].bounds(1)
    row = np.searchsorted(rows, np.arange(hd), side="right") - 1
    start = 0
    for tokens in chunks:
        before = _cache_columns(shard, 1)
        prefill_layer(shard, split(x[start:start + tokens]), 1, start)
        after = _cache_columns(shard, 1)
        assert [after[p] for p in range(start + tokens)] == kv_columns(start + tokens, region.w).tolist()
        width = (CFG.n_heads + 2 * CFG.n_kv_heads) * hd
        numbered = np.arange(1, tokens * width + 1, dtype=np.float32).reshape(tokens, width)
        qkv = _homes(spread(grid, Region(0, 0, s, s), numbered))
        moves, shifts, reads = [], [], []  # each a message per pair of cores
        for t in range(tokens):
            for j in range(2 * kvd):  # K then V, each (kv head, dim)
                v = int(numbered[t, CFG.n_heads * hd + j])
                moves.append((qkv[v], (row[j % hd], after[start + t])))
        ctx = _homes(spread(grid, Region(0, 0, s, s), np.arange(1, (start + tokens) * hd + 1).reshape(-1, hd)))
        for p in range(start):
            for j in range(2 * kvd):
                shifts.append(((row[j % hd], before[p]), (row[j % hd], after[p])))
                reads.append(((row[j % hd], before[p]), ctx[p * hd + j % hd + 1]))
        want = _routed(region, moves)
        if shifts:
            want.add(_routed(region, shifts))
        _assert_same(kv_load(CFG, region, PromptChunk(start, tokens), 1, 4), want)
        if start:
            _assert_same(kv_read_load(CFG, region, PromptChunk(start, tokens), 1, 4), _routed(region, reads))
        start += tokens


def test_a_message_books_every_link_it_passes_once():
    region = Region(0, 0, 5, 4)
    load = route(region, np.array([[3, 4], [0, 0], [1, 1]]), np.array([[0, 1], [0, 0], [2, 1]]),
                 np.array([8.0, 4.0, 2.0]))
    assert load.messages == 2 and load.hops == 6  # (3,4)->(0,1): 3 west, 3 north; (0,0) stays
    assert load.total() == 8 * 6 + 2 * 1
    assert load.bytes[1, 3, 2:5].tolist() == [8, 8, 8] and load.bytes[3, 1:4, 1].tolist() == [8, 8, 8]
    assert load.bytes[2, 1, 1] == 2


def test_a_prompt_chunk_sees_the_positions_before_it_and_its_own():
    """A chunk of 9 tokens from position 5 sees 5 + 9 = 14 positions; a chunk of no token, or one starting before
    position 0, is refused with what to give instead."""
    assert PromptChunk(5, 9).context == 14 and PromptChunk(0, 1).context == 1
    for start, tokens in ((0, 0), (-1, 3)):
        with pytest.raises(ValueError, match="at least one token and a start >= 0"):
            PromptChunk(start, tokens)
