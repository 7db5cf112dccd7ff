"""The fast path equals the hop-by-hop path: same results (float tolerance: the sums run in another order)
and exactly the same booked counts (hops, routing stages, messages, link bytes; cycles to float rounding),
on every mesh of the test matrix and for every allreduce algorithm -- for the collectives alone, for a whole
decoder layer (MeshGEMVs, norms, attention) and for the embedding/head."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import pack_embed, pack_layer
from waferrt.decode.shards import EmbedShard, LayerShard
from waferrt.fabric.comm import Collectives, LineComm, Slices, Span
from waferrt.model import synthetic_llama, tiny_config

SHAPES = [(1, 1), (1, 6), (5, 1), (2, 3), (4, 5), (3, 7), (8, 16)]  # (rows, cols)
ALGOS = ["ktree", "ring", "pipeline"]
CFG = tiny_config()
W = synthetic_llama(CFG, seed=4)


def _same_counts(a: Ledger, b: Ledger) -> None:
    fast, checked = a.by_op, b.by_op
    assert fast.keys() == checked.keys() and a.calls == b.calls
    for op in fast:
        f, c = fast[op], checked[op]
        assert (f.hops, f.stages, f.messages, f.link_bytes, f.flops) == (c.hops, c.stages, c.messages,
                                                                         c.link_bytes, c.flops), op
        assert f.cycles == pytest.approx(c.cycles, rel=1e-12), op


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("axis", ["x", "y"])
def test_allreduce_fast_equals_hop_by_hop(rows, cols, algo, axis):
    region = Region(0, 0, cols, rows)
    rng = np.random.default_rng(rows * 100 + cols)
    n = cols if axis == "x" else rows
    buf = rng.standard_normal((n, 3, rows if axis == "x" else cols, 5)).astype(np.float32)  # (line, data..)
    out = {}
    ledgers = {}
    for fast in (True, False):
        ledgers[fast] = Ledger(WSE2)
        comm = LineComm(axis, Span.of(region), ledgers[fast], fast=fast)
        with ledgers[fast].op("test"):
            out[fast] = (comm.allreduce(buf, Collectives(algo, 2), "sum", collapse=True),
                         comm.allreduce(buf, Collectives(algo, 3), "max"),
                         comm.allreduce(buf[:, 0], Collectives(algo, 2), "sum", Slices(replicated=True), collapse=True))
    for f, c in zip(out[True], out[False], strict=True):
        np.testing.assert_allclose(f, c, rtol=1e-5, atol=1e-5)
    _same_counts(ledgers[True], ledgers[False])


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("algo", ALGOS)
def test_a_layer_and_the_head_fast_equal_hop_by_hop(rows, cols, algo):
    region = Region(0, 0, cols, rows)
    results, ledgers = {}, {}
    for fast in (True, False):
        ledgers[fast] = led = Ledger(TINY)
        coll = Collectives(algo, 2, fast)
        layer = LayerShard(Decoding(CFG, coll=coll), region, pack_layer(CFG, W.layers[0], region),
                           KVCapacity(3, 20), led)
        embed = EmbedShard(CFG, region, pack_embed(CFG, W.embed, W.final_norm, region), led, coll)
        slots, poss = np.array([0, 0, 0, 2, 1]), np.array([0, 1, 2, 0, 0])  # a prompt, two one-token ones
        x = embed.lookup(np.array([5, 9, 200, 31, 7]))
        for _ in range(2):  # twice: the second pass sees a filled cache (and starts slot 2/1 afresh)
            x = layer.forward(x, slots, poss)
        results[fast] = (x, embed.logits(x), layer.kv.held(0), layer.kv.positions(2))
    f, c = results[True], results[False]
    np.testing.assert_allclose(f[0], c[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(f[1], c[1], rtol=1e-4, atol=1e-4)
    assert np.array_equal(f[2], c[2]) and f[3] == c[3]
    _same_counts(ledgers[True], ledgers[False])


@pytest.mark.parametrize("rows,cols", [(1, 1), (2, 3), (8, 16)])
def test_a_layers_replayed_bookings_are_what_it_booked_the_long_way(rows, cols):
    """Decode steps on the fast path book a layer's parts once per (items, entries held) and replay them
    (Ledger.replay): over many steps, every count is still the hop-by-hop path's, which books every message."""
    region = Region(0, 0, cols, rows)
    ledgers, layers = {}, {}
    for fast in (True, False):
        ledgers[fast] = led = Ledger(TINY)
        coll = Collectives("ktree", 2, fast)
        layers[fast] = LayerShard(Decoding(CFG, coll=coll), region, pack_layer(CFG, W.layers[0], region),
                                  KVCapacity(4, 24), led)
        embed = EmbedShard(CFG, region, pack_embed(CFG, W.embed, W.final_norm, region), led, coll)
        slots = np.array([0, 2])
        for pos in range(12):  # two requests a step, one position further each
            layers[fast].forward(embed.lookup(np.array([pos, 3 * pos])), slots, np.full(2, pos))
    assert 0 < len(layers[True]._booked) < 2 * 12  # parts were replayed, not booked anew
    _same_counts(ledgers[True], ledgers[False])
