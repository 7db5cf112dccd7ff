"""STAR's sparse attention in a layer region's decode (waferrt.decode.sparse via LayerShard): what it books is
its closed form (decode.cost under a sparse Decoding.attention), K >= the context is dense exactly, and the
keys it keeps are the reference's (model.sparse.select_top over predict_scores)."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY
from waferrt.decode.cost import layer_decode_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.shards import LayerShard
from waferrt.decode.sparse import predicted, ranked
from waferrt.fabric.comm import KTREE_FAST, Collectives
from waferrt.model import AttentionMode, synthetic_llama, tiny_config
from waferrt.model.sparse import predict_scores, select_top

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


def decode(mode: AttentionMode, region: Region, batch: int, steps: int, check=None,
           coll: Collectives = KTREE_FAST) -> list[np.ndarray]:
    """`steps` tokens of `batch` requests through layer 0 on `region`; the outputs of every step."""
    ledger, dec = Ledger(TINY), Decoding(CFG, coll=coll, attention=mode)
    shard = LayerShard(dec, region, pack_layer(CFG, W.layers[0], region, "float32"), KVCapacity(batch, 24), ledger)
    chunks, out = Chunks(CFG.dim, region.w), []
    for pos in range(steps):
        ledger.clear()
        x = chunks.split(np.random.default_rng(pos).standard_normal((batch, CFG.dim)).astype(np.float32))
        out.append(shard.forward(x, np.arange(batch), np.full(batch, pos)))
        if check:
            check(ledger, dec, pos)
    return out


@pytest.mark.parametrize(("w", "h", "batch", "keep"), [(4, 3, 1, 3), (4, 3, 2, 5), (1, 1, 1, 2), (5, 2, 2, 4),
                                                       (2, 4, 3, 1)])
def test_a_sparse_layer_books_its_closed_form(w: int, h: int, batch: int, keep: int) -> None:
    """Dense while the context is at most K, then prediction, top-K and attention over K keys."""
    region = Region(0, 0, w, h)

    def check(ledger, dec, pos):
        assert ledger.by_op["layer"] == layer_decode_cost(TINY, dec, region, pos + 1, batch, pos % w), pos

    decode(AttentionMode(keep=keep), region, batch, 9, check)


def test_the_sparse_closed_form_differs_from_dense_once_the_context_passes_k() -> None:
    dense, sparse = Decoding(CFG), Decoding(CFG, attention=AttentionMode(keep=4))
    region = Region(0, 0, 4, 3)
    assert layer_decode_cost(TINY, sparse, region, 4) == layer_decode_cost(TINY, dense, region, 4)
    assert layer_decode_cost(TINY, sparse, region, 20) != layer_decode_cost(TINY, dense, region, 20)


@pytest.mark.parametrize("mode", ["sparse:9", "sparse:64"])
def test_k_at_or_above_the_context_is_dense_exactly(mode: str) -> None:
    region = Region(0, 0, 4, 3)
    for a, b in zip(decode(AttentionMode.parse(mode), region, 2, 9), decode(AttentionMode(), region, 2, 9),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_fewer_keys_change_the_output() -> None:
    region = Region(0, 0, 4, 3)
    sparse, dense = decode(AttentionMode(keep=2), region, 1, 9), decode(AttentionMode(), region, 1, 9)
    np.testing.assert_array_equal(sparse[1], dense[1])  # 2 positions held: all kept
    assert not np.array_equal(sparse[8], dense[8])


def test_the_keys_kept_are_the_references_top_k() -> None:
    """predicted + ranked on the decode's layout (B, nkv, rep, D) x (B, nkv, D, L) keep what select_top over
    predict_scores keeps, item by item; an item with a shorter context keeps its own keys_kept of it."""
    rng = np.random.default_rng(3)
    B, nkv, rep, D, L = 2, 3, 3, 16, 40
    qg = rng.standard_normal((B, nkv, rep, D)).astype(np.float32)
    kc = rng.standard_normal((B, nkv, D, L)).astype(np.float32)
    poss = np.array([L - 1, 25])
    visible = (np.arange(L)[None] <= poss[:, None])[:, None, None]
    mode = AttentionMode(fraction=0.25)
    order, kept = ranked(predicted(qg, kc, np.arange(B), visible), poss, mode)  # (B, nkv, rep, K), (B, 1, 1, K)
    kept = np.broadcast_to(kept, order.shape)
    for b, p in enumerate(poss):
        pred = predict_scores(qg[b].reshape(nkv * rep, D), kc[b, :, :, : p + 1].transpose(0, 2, 1))
        want = select_top(pred, mode.keys_kept(int(p) + 1))  # (heads, keep), highest first
        got, mine = order[b].reshape(nkv * rep, -1), kept[b].reshape(nkv * rep, -1)
        for h in range(nkv * rep):
            assert got[h][mine[h]].tolist() == want[h].tolist(), (b, h)  # the same keys, in the same order


def test_ties_keep_the_earlier_positions_as_a_stable_sort_does() -> None:
    pred = np.array([[[[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, -np.inf]]]], np.float32)  # (1, 1, 1, 7)
    order, kept = ranked(pred, np.array([5]), AttentionMode(keep=3))
    assert order[0, 0, 0].tolist() == [1, 3, 2] and kept.all()  # both 3s, then the first 2
    assert select_top(pred[0, 0, :, :6], 3)[0].tolist() == [1, 3, 2]


@pytest.mark.parametrize(("w", "h", "batch", "keep"), [(4, 3, 2, 3), (5, 2, 1, 4), (1, 1, 2, 2)])
def test_the_hop_by_hop_path_decodes_sparse_as_the_fast_path_and_books_the_same(w, h, batch, keep) -> None:
    """Collectives(fast=False) sends every message (the prediction's reduce, the top-K kernel, the attention
    over each core's kept keys): the same outputs as the fast path, the same bookings, step by step."""
    region, mode = Region(0, 0, w, h), AttentionMode(keep=keep)
    books: dict[int, list] = {}

    def record(ledger, dec, pos):
        books.setdefault(pos, []).append(ledger.by_op["layer"])

    fast = decode(mode, region, batch, 9, record)
    hops = decode(mode, region, batch, 9, record, Collectives(fast=False))
    for pos, (a, b) in enumerate(zip(fast, hops, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"position {pos}")
        assert books[pos][0] == books[pos][1], pos


@pytest.mark.parametrize("coll", [KTREE_FAST, Collectives(fast=False)], ids=["fast", "hops"])
def test_the_sparse_path_never_computes_the_dense_scores(coll: Collectives) -> None:
    """At 20 positions (5 a core on 4 columns) with K = 3, every query head's scores are computed on its kept keys
    alone: 3 on the fast path (joined), 4 columns x min(3, 5) on the hop-by-hop one -- never the 20 of Q.K^T.
    The seam: the layer's own Net, its products over the rows (the scores' Q.K^T) counted as they run."""
    region, mode = Region(0, 0, 4, 3), AttentionMode(keep=3)
    ledger, dec = Ledger(TINY), Decoding(CFG, coll=coll, attention=mode)
    shard = LayerShard(dec, region, pack_layer(CFG, W.layers[0], region, "float32"), KVCapacity(1, 24), ledger)
    scored: list[int] = []

    class Counted(type(shard.net)):
        def dot(self, comm, a, b, positions=0):
            out = super().dot(comm, a, b, positions)
            if comm.axis == "y":  # the scores: q against the keys, reduced over the rows
                scored.append(out[0, 0, 0].size)  # one query head's score elements
            return out

    shard.net = Counted(coll)
    chunks = Chunks(CFG.dim, region.w)
    for pos in range(20):
        scored.clear()
        x = chunks.split(np.random.default_rng(pos).standard_normal((1, CFG.dim)).astype(np.float32))
        shard.forward(x, np.arange(1), np.full(1, pos))
    assert scored == [3 if coll.fast else 4 * 3]
