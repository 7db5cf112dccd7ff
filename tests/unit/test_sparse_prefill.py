"""STAR's sparse attention in the MeshGEMM prefill (waferrt.decode.sparse_prefill): a prompt's layer equals the
reference's sparse layer_prefill, books its closed form (prediction, the decode's row top-K, attention over the
kept keys), and K >= the prompt is dense exactly; a whole decode with --prefill and sparse:K >= the prompt gives
dense's tokens (LocalDecoder.use_attention)."""

from __future__ import annotations

import numpy as np
import pytest

import waferrt.decode.prefill as prefill_module
import waferrt.kernels.attention as attention_kernel
import waferrt.kernels.gemm as gemm_kernel
import waferrt.kernels.gemm_backward as backward_kernel
import waferrt.kernels.sparse_attention as sparse_kernel
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.prefill import prefill_layer, prefill_layer_cost
from waferrt.decode.shards import LayerShard
from waferrt.model import AttentionMode, ReferenceModel, Sampler, synthetic_llama, tiny_config
from waferrt.model.reference import Layer, Rope, layer_prefill, rope_cos_sin
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, LocalDecoder

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


def prefill(mode: AttentionMode, region: Region, tokens: int, dtype: str = "float32"):
    """A prompt of `tokens` through layer 0 on `region` -> (output (tokens, dim), the ledger, the Decoding)."""
    ledger, dec = Ledger(TINY, dtype), Decoding(CFG, dtype, attention=mode)
    shard = LayerShard(dec, region, pack_layer(CFG, W.layers[0], region, dtype), KVCapacity(2, 32), ledger)
    x = np.random.default_rng(tokens).standard_normal((tokens, CFG.dim)).astype(np.float32)
    chunks = Chunks(CFG.dim, region.w)
    return chunks.join(prefill_layer(shard, chunks.split(x), slot=1)), ledger, dec, x


@pytest.mark.parametrize(("w", "h", "tokens", "mode"), [(4, 4, 16, "sparse:3"), (3, 5, 13, "sparse:5"),
                                                        (4, 4, 11, "sparse:0.3"), (1, 1, 6, "sparse:2")])
def test_a_sparse_prefill_is_the_references_and_books_its_closed_form(w, h, tokens, mode) -> None:
    mode, region = AttentionMode.parse(mode), Region(0, 0, w, h)
    got, ledger, dec, x = prefill(mode, region, tokens)
    kc = np.zeros((CFG.n_kv_heads, 32, CFG.head_dim), np.float32)
    cos, sin = rope_cos_sin(np.arange(tokens), CFG.head_dim, CFG.rope_theta)
    want = layer_prefill(x, Layer(W.layers[0], CFG, mode), kc, np.zeros_like(kc), Rope(np.arange(tokens), cos, sin))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert ledger.by_op["prefill"] == prefill_layer_cost(TINY, dec, region, tokens)
    dense = prefill_layer_cost(TINY, Decoding(CFG), region, tokens)
    assert ledger.by_op["prefill"] != dense  # the prediction and the top-K were booked


@pytest.mark.parametrize("mode", ["sparse:9", "sparse:64"])
def test_k_at_or_above_the_prompt_is_dense_exactly(mode) -> None:
    region = Region(0, 0, 4, 3)
    got, ledger, _, _ = prefill(AttentionMode.parse(mode), region, 9)
    want, dense_ledger, _, _ = prefill(AttentionMode(), region, 9)
    np.testing.assert_array_equal(got, want)
    assert ledger.by_op == dense_ledger.by_op


def test_a_decode_with_prefill_and_k_at_the_context_gives_denses_tokens() -> None:
    """sparse:25 keeps every key of a 20-token prompt and its 5 new tokens: the prefill and the decode are dense's."""
    placement = plan(CFG, TINY, MeshSpec(8, 8, 8, 8), kv=KVReserve(64, 2))
    requests = [GenRequest(tuple(range(3, 23)), 5), GenRequest((5, 6, 7, 8, 9, 10, 11, 12), 4)]
    sampler = Sampler(temperature=0.9, top_k=30, seed=1)
    dense, _ = LocalDecoder(CFG, W, placement).use_prefill().generate(requests, sampler)
    at_k = LocalDecoder(CFG, W, placement).use_attention(AttentionMode(keep=25)).use_prefill()
    got, _ = at_k.generate(requests, sampler)
    assert [c.tokens for c in got] == [c.tokens for c in dense]
    assert at_k.setup.attention == AttentionMode(keep=25) and at_k.setup.prefill


@pytest.mark.parametrize(("w", "h"), [(4, 4), (3, 5)])
def test_a_later_chunk_selects_over_the_cached_positions_too(w, h) -> None:
    """A prompt in two chunks (8 then 7 tokens, sparse:4): the second chunk's queries choose among the 8 cached
    positions and their own, as the reference's layer_prefill from start 8 does, booking its closed form."""
    mode, region = AttentionMode(keep=4), Region(0, 0, w, h)
    ledger, dec = Ledger(TINY), Decoding(CFG, attention=mode)
    shard = LayerShard(dec, region, pack_layer(CFG, W.layers[0], region), KVCapacity(2, 32), ledger)
    x = np.random.default_rng(3).standard_normal((15, CFG.dim)).astype(np.float32)
    kc = np.zeros((CFG.n_kv_heads, 32, CFG.head_dim), np.float32)
    vc, layer, chunks, got = np.zeros_like(kc), Layer(W.layers[0], CFG, mode), Chunks(CFG.dim, region.w), []
    for lo, hi in ((0, 8), (8, 15)):
        ledger.clear()
        got.append(chunks.join(prefill_layer(shard, chunks.split(x[lo:hi]), slot=0, start=lo)))
        cos, sin = rope_cos_sin(np.arange(lo, hi), CFG.head_dim, CFG.rope_theta)
        want = layer_prefill(x[lo:hi], layer, kc, vc, Rope(np.arange(lo, hi), cos, sin))
        np.testing.assert_allclose(got[-1], want, rtol=1e-4, atol=1e-4)
        assert ledger.by_op["prefill"] == prefill_layer_cost(TINY, dec, region, hi - lo, lo)


def powers_of_two(a: np.ndarray) -> bool:
    """Every element a signed power of two or 0: the keys in the log domain (model.sparse.log_keys)."""
    m = np.frexp(a)[0]
    return bool(np.all((m == 0) | (np.abs(m) == 0.5)))


def test_the_sparse_prefill_never_computes_the_dense_scores(monkeypatch) -> None:
    """16 tokens on a 2x2 square (8-key blocks), sparse:3: the only Q.K^T over every key is the prediction's,
    over keys that are signed powers of two; the scores from the keys themselves are 3 a query per block step
    (kernels.sparse_attention.kept_dot), never the 8 of the dense product, and P.V multiplies 3 keys a row.
    The seams: the transposed MeshGEMM the attention kernel calls, the kept products, counted as they run."""
    dense_products, kept, pv = [], [], []

    def counted_accumulate(ctx, grid, fixed, moving, variant, chosen=None):
        if chosen is None:
            dense_products.append(powers_of_two(moving))
        return real_accumulate(ctx, grid, fixed, moving, variant, chosen)

    def counted_dot(q, ks):
        out = real_dot(q, ks)
        kept.append(out.shape[-1])
        return out

    def counted_weighted(self, t, p, v):
        pv.append(p.shape[-1])
        return real_weighted(self, t, p, v)

    real_accumulate, real_dot = attention_kernel.accumulate, sparse_kernel.kept_dot
    real_weighted = sparse_kernel.KeptKeys.weighted
    monkeypatch.setattr(attention_kernel, "accumulate", counted_accumulate)
    monkeypatch.setattr(sparse_kernel, "kept_dot", counted_dot)
    monkeypatch.setattr(sparse_kernel.KeptKeys, "weighted", counted_weighted)
    prefill(AttentionMode(keep=3), Region(0, 0, 2, 2), 16)
    assert dense_products == [True]  # the prediction alone, in the log domain
    assert kept == [3, 3] and pv == [3, 3]  # two steps of the 2-ring, 3 keys a query each


def test_the_sparse_prefill_moves_compact_score_and_probability_blocks(monkeypatch) -> None:
    """The same prefill: every block the attention's two MeshGEMMs move round the rows' rings (the score
    accumulators, then P) holds 3 values a (head, query), never the key block's 8; K's and V's blocks move
    whole (8 keys by head_dim / 2). Counted at the seam every ring move goes through."""
    moved, attending = [], []

    def counted_move(ctx, buf, axis, places, lines):
        if attending:  # not the projections' MeshGEMMs
            moved.append((axis, buf.shape[-2:]))
        return real_move(ctx, buf, axis, places, lines)

    def counted_attention(*args, **kwargs):
        attending.append(True)
        try:
            return real_attention(*args, **kwargs)
        finally:
            attending.pop()

    real_move, real_attention = gemm_kernel.ring_move, prefill_module.causal_attention
    for module in (gemm_kernel, attention_kernel, backward_kernel):
        monkeypatch.setattr(module, "ring_move", counted_move)
    monkeypatch.setattr(prefill_module, "causal_attention", counted_attention)
    prefill(AttentionMode(keep=3), Region(0, 0, 2, 2), 16)
    hd = CFG.head_dim // 2
    rows = [shape for axis, shape in moved if axis == "x"]
    # the prediction's score accumulators (every key, 2 moves), the kept scores' (2), P (1): 8 queries a block
    assert rows == [(8, 8), (8, 8), (8, 3), (8, 3), (8, 3)]
    assert {shape for axis, shape in moved if axis == "y"} == {(8, hd)}  # K's and V's blocks, skews included


def test_a_decode_with_a_sparse_prefill_gives_the_references_sparse_tokens() -> None:
    """sparse:3 over a 20-token prompt: the mesh's prefill (prediction, the row's top-K, the kept keys' scores
    alone) and decode give the numpy reference's sparse tokens (its per-row sparse prefill), not dense's."""
    placement = plan(CFG, TINY, MeshSpec(8, 8, 8, 8), kv=KVReserve(64, 2))
    req, mode = GenRequest(tuple(range(3, 23)), 6), AttentionMode(keep=3)

    def reference(m: AttentionMode) -> list[int]:
        model = ReferenceModel(CFG, W, m)
        cache = model.new_cache(32)
        logits, out = model.prefill(list(req.prompt_ids), cache), []
        while len(out) < req.max_new_tokens:
            out.append(int(np.argmax(logits)))
            logits = model.step(out[-1], cache.length, cache)
        return out

    got, _ = LocalDecoder(CFG, W, placement).use_attention(mode).use_prefill().generate([req], Sampler())
    assert got[0].tokens == reference(mode) != reference(AttentionMode())
