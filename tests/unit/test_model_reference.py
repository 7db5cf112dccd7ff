"""The numpy reference decoder on tiny synthetic weights: float32 discipline, RoPE, GQA, prefill vs step."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from waferrt.model import (
    KVCache,
    Layer,
    LlamaConfig,
    ReferenceModel,
    Rope,
    Sampler,
    apply_rope,
    attention,
    causal_attention,
    layer_forward,
    rmsnorm,
    rope,
    rope_cos_sin,
    swiglu,
    synthetic_llama,
    tiny_config,
)
from waferrt.model.reference import qkv_rope

F32 = np.float32


@pytest.fixture(scope="module")
def model() -> ReferenceModel:
    config = tiny_config()
    return ReferenceModel(config, synthetic_llama(config, seed=1))


def test_every_activation_stays_float32(model: ReferenceModel) -> None:
    config, lw = model.config, model.weights.layers[0]
    x = model.weights.embed[5]
    h = rmsnorm(x, lw.attn_norm, config.norm_eps)
    cos, sin = rope_cos_sin(3, config.head_dim, config.rope_theta)
    q, k, v = qkv_rope(h, lw, config, cos, sin)
    kc = np.random.default_rng(0).standard_normal((config.n_kv_heads, 4, config.head_dim), dtype=F32)
    a = attention(q, kc, kc, config.n_heads // config.n_kv_heads)
    m = swiglu(h, lw.w_gate, lw.w_up, lw.w_down)
    cache = model.new_cache()
    y = layer_forward(x, Layer(lw, config), cache.k[0], cache.v[0], Rope(0, cos, sin))
    for name, arr in dict(h=h, cos=cos, sin=sin, q=q, k=k, v=v, a=a, m=m, y=y, kcache=cache.k[0]).items():
        assert arr.dtype == F32, name
    logits = model.step(7, 0, model.new_cache())
    assert logits.dtype == F32 and logits.shape == (config.vocab_size,)


def test_rmsnorm_matches_definition() -> None:
    x = np.random.default_rng(0).standard_normal((3, 16), dtype=F32)
    w = np.linspace(0.5, 1.5, 16, dtype=F32)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(rmsnorm(x, w, 1e-5), expected, rtol=1e-5)


@pytest.mark.parametrize("pos", [0, 1, 17, 1000])
def test_rope_matches_complex_rotation_of_adjacent_pairs(pos: int) -> None:
    heads, hd, theta = 3, 8, 10000.0
    x = np.random.default_rng(pos).standard_normal((heads, hd), dtype=F32)
    z = x[:, 0::2].astype(np.float64) + 1j * x[:, 1::2]  # pair (x[2i], x[2i+1]) as one complex number
    z = z * np.exp(1j * pos * theta ** (-np.arange(0, hd, 2) / hd))
    expected = np.stack([z.real, z.imag], axis=-1).reshape(heads, hd)
    got = rope(x, pos, theta)
    assert got.dtype == F32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 16), dtype=F32)
    s1 = float(rope(q, 10, 1e4).ravel() @ rope(k, 7, 1e4).ravel())
    s2 = float(rope(q, 103, 1e4).ravel() @ rope(k, 100, 1e4).ravel())
    assert s1 == pytest.approx(s2, rel=1e-4)


def test_rope_tables_batch_over_positions() -> None:
    cos, sin = rope_cos_sin(np.arange(5), 8, 100.0)
    assert cos.shape == sin.shape == (5, 4) and cos.dtype == F32
    c3, s3 = rope_cos_sin(3, 8, 100.0)
    np.testing.assert_array_equal(cos[3], c3)
    np.testing.assert_array_equal(sin[3], s3)
    x = np.ones((5, 2, 8), dtype=F32)
    np.testing.assert_array_equal(apply_rope(x, cos[:, None], sin[:, None])[3], rope(x[3], 3, 100.0))


def naive_gqa(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_rep: int) -> np.ndarray:
    out = np.zeros(q.shape)
    for h in range(q.shape[0]):
        kv = h // n_rep
        s = np.array([q[h].astype(np.float64) @ k[kv, t] for t in range(k.shape[1])]) / np.sqrt(q.shape[1])
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[kv]
    return out


@pytest.mark.parametrize("n_heads,n_kv", [(4, 2), (6, 3), (4, 4), (4, 1)])
def test_gqa_attention_matches_naive_loop(n_heads: int, n_kv: int) -> None:
    rng = np.random.default_rng(n_heads * 10 + n_kv)
    q = rng.standard_normal((n_heads, 8), dtype=F32)
    k, v = rng.standard_normal((2, n_kv, 11, 8), dtype=F32)
    got = attention(q, k, v, n_heads // n_kv)
    assert got.dtype == F32
    np.testing.assert_allclose(got, naive_gqa(q, k, v, n_heads // n_kv), rtol=1e-5, atol=1e-6)


def test_causal_attention_equals_attention_per_position() -> None:
    rng = np.random.default_rng(3)
    start, seq = 4, 5
    q = rng.standard_normal((seq, 6, 8), dtype=F32)
    k, v = rng.standard_normal((2, 2, start + seq, 8), dtype=F32)
    got = causal_attention(q, k, v, 3, start)
    for i in range(seq):
        n = start + i + 1
        np.testing.assert_allclose(got[i], attention(q[i], k[:, :n], v[:, :n], 3), rtol=1e-5, atol=1e-6)


def test_prefill_matches_repeated_step(model: ReferenceModel) -> None:
    ids = [3, 141, 59, 26, 5, 35, 8, 97, 9]
    stepped = model.new_cache()
    for pos, t in enumerate(ids):
        step_logits = model.step(t, pos, stepped)
    batched = model.new_cache()
    prefill_logits = model.prefill(ids, batched)
    assert prefill_logits.dtype == F32 and batched.length == stepped.length == len(ids)
    np.testing.assert_allclose(prefill_logits, step_logits, rtol=1e-4, atol=1e-5)
    n = len(ids)
    for layer in range(model.config.n_layers):
        np.testing.assert_allclose(batched.k[layer][:, :n], stepped.k[layer][:, :n], atol=1e-5)
        np.testing.assert_allclose(batched.v[layer][:, :n], stepped.v[layer][:, :n], atol=1e-5)


def test_prefill_continues_an_existing_cache(model: ReferenceModel) -> None:
    ids = [10, 20, 30, 40, 50, 60]
    whole = model.prefill(ids, model.new_cache())
    cache = model.new_cache()
    model.prefill(ids[:2], cache)
    model.step(ids[2], 2, cache)
    np.testing.assert_allclose(model.prefill(ids[3:], cache), whole, rtol=1e-4, atol=1e-5)


def test_cache_growth_and_rewind_do_not_change_results(model: ReferenceModel) -> None:
    ids = [1, 2, 3, 4, 5, 6, 7]
    big, small = model.new_cache(capacity=64), model.new_cache(capacity=1)
    for pos, t in enumerate(ids):
        np.testing.assert_array_equal(model.step(t, pos, big), model.step(t, pos, small))
    assert small.capacity >= len(ids)
    rewound = model.step(99, 3, big)  # rewrite position 3: the cache forgets positions 3..
    assert big.length == 4
    fresh = model.new_cache()
    for pos, t in enumerate([1, 2, 3, 99]):
        expected = model.step(t, pos, fresh)
    np.testing.assert_array_equal(rewound, expected)


def test_step_rejects_gaps_bad_ids_and_overflow(model: ReferenceModel) -> None:
    cache = model.new_cache()
    with pytest.raises(ValueError, match="gap"):
        model.step(1, 2, cache)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.step(model.config.vocab_size, 0, cache)
    with pytest.raises(ValueError, match="context"):
        model.prefill([1] * (model.config.max_seq_len + 1), cache)


def test_synthetic_weights_are_seeded_tied_and_o1() -> None:
    config = tiny_config()
    a, b, c = synthetic_llama(config, 0), synthetic_llama(config, 0), synthetic_llama(config, 1)
    np.testing.assert_array_equal(a.layers[2].wq, b.layers[2].wq)
    assert not np.array_equal(a.layers[2].wq, c.layers[2].wq)
    assert a.tied and a.head is a.embed
    assert a.nbytes() == config.params() * 4
    logits = ReferenceModel(config, a).prefill(list(range(20)), KVCache(config))
    assert 0.1 < float(logits.std()) < 10


def test_untied_config_and_shape_check() -> None:
    config = LlamaConfig(
        vocab_size=32, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=24, tie_embeddings=False
    )
    w = synthetic_llama(config, 0)
    assert not w.tied and w.nbytes() == config.params() * 4
    with pytest.raises(ValueError, match="layers"):
        w.check(tiny_config())


def test_greedy_generate_is_deterministic_and_stops(model: ReferenceModel) -> None:
    first = list(model.generate([1, 2, 3], 12))
    assert first == list(model.generate([1, 2, 3], 12)) and len(first) == 12
    stopped = list(model.generate([1, 2, 3], 12, Sampler(), stop_ids=(first[4],)))
    assert stopped == first[: first.index(first[4]) + 1]


def test_importing_the_model_package_pulls_in_no_ray_or_zmq() -> None:
    code = "import sys, waferrt.model; print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'zmq'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_batched_decode_gives_the_one_at_a_time_tokens():
    """The throughput anchor: several requests decoded together (batched steps, each its own cache and
    position) give the tokens of decoding them one at a time, and the logits agree to float32 rounding."""
    from waferrt.serving import GenRequest, generate_batched, generate_reference

    config = tiny_config()
    w = synthetic_llama(config, seed=7)
    requests = [GenRequest((5, 6, 7), 9), GenRequest((100,), 12), GenRequest((1, 2, 3, 4, 5), 5, (77,))]
    sampler = Sampler(temperature=0.7, top_k=20, seed=3)
    one, _ = generate_reference(config, w, requests, sampler)
    together, stats = generate_batched(config, w, requests, sampler)
    assert [c.tokens for c in together] == [c.tokens for c in one]
    assert [c.finish for c in together] == [c.finish for c in one] and stats.tokens == sum(len(c.tokens) for c in one)
    model = ReferenceModel(config, w)
    histories = ([5, 6, 7], [100])  # two requests at different positions
    apart, together = ([model.new_cache() for _ in histories] for _ in range(2))
    for caches in (apart, together):
        for ids, cache in zip(histories, caches, strict=True):
            model.prefill(ids, cache)
    singles = [model.step(t, c.length, c) for t, c in zip((3, 9), apart, strict=True)]
    batch = model.step_batch([3, 9], [c.length for c in together], together)
    np.testing.assert_allclose(batch, np.stack(singles), atol=1e-5)
    assert [c.length for c in together] == [4, 2]
