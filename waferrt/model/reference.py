"""The single-process numpy reference decoder for a Llama model: the ground truth for the wafer.

Contract:
- float32 in, float32 out, float32 in between: weights, activations, K/V cache and logits. Scalars that meet
  arrays are np.float32, so numpy's promotion never widens anything to float64.
- Linear layers are y = W @ x with W stored (out, in) (for a batch of rows: x @ W.T).
- RoPE rotates ADJACENT pairs (x[2i], x[2i+1]) of each head, the layout of Q/K weights in a GGUF.
- Grouped-query attention: query head h reads K/V head h // n_rep, n_rep = n_heads // n_kv_heads.
- `ReferenceModel.step(token, pos, cache)` runs one token; `prefill(ids, cache)` runs many at once with
  batched matmuls and a causal mask, and agrees with repeated `step` to float32 rounding; `step_batch`
  runs one token of each of several requests at once (the weights read once for all of them).
- The FFN (`ffn`) is the dense SwiGLU or, for an MoE config, Mixtral's: the router's logits pick the top_k
  experts (ties to the lower index), a softmax over those k gives their gates, the output is the gated sum
  of the chosen SwiGLU experts, plus the shared expert's output when the config has one.
The per-layer pieces are module-level functions so other implementations can reuse and compare them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from waferrt.model import sparse
from waferrt.model.config import LlamaConfig
from waferrt.model.kvcache import KVCache
from waferrt.model.sampling import Sampler
from waferrt.model.sparse import DENSE, AttentionMode, softmax
from waferrt.model.weights import LayerWeights, LlamaWeights


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = W @ x for x (in,), or for every row of x (..., in). W is (out, in)."""
    return x @ w.T


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis. x (..., dim), w (dim,)."""
    ms = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * w


def rope_cos_sin(pos: int | np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the RoPE angles pos * theta^(-2i/head_dim), i < head_dim/2.

    Angles are computed in float64 and rounded once to float32. pos may be an int, giving (head_dim//2,)
    each, or an array of positions (seq,), giving (seq, head_dim//2) each.
    """
    inv_freq = float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (head_dim//2,)
    angles = np.multiply.outer(np.asarray(pos, dtype=np.float64), inv_freq)  # (*pos.shape, head_dim//2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by the angle whose cos/sin are cos[i]/sin[i].

    x (..., head_dim); cos, sin (head_dim//2,) or any shape that broadcasts against (..., head_dim//2).
    """
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)  # (..., head_dim//2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = np.empty_like(pairs)
    out[..., 0] = x0 * cos - x1 * sin
    out[..., 1] = x0 * sin + x1 * cos
    return out.reshape(x.shape)


def rope(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """RoPE for the heads of one position: x (heads, head_dim) -> (heads, head_dim)."""
    cos, sin = rope_cos_sin(pos, x.shape[-1], theta)
    return apply_rope(x, cos, sin)


def attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_rep: int, mode: AttentionMode = DENSE
) -> np.ndarray:
    """Grouped-query attention of one query position over every cached position, dense or sparse
    (``waferrt.model.sparse``: STAR's predict, top-K, sorted-updating attention).

    q (n_heads, head_dim); k_cache, v_cache (n_kv_heads, seq, head_dim) -> (n_heads, head_dim).
    """
    if q.shape[0] != n_rep * k_cache.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads do not read {k_cache.shape[0]} K/V heads {n_rep} each")
    return sparse.attention(q, k_cache, v_cache, mode)


def causal_attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_rep: int, start: int, mode: AttentionMode = DENSE
) -> np.ndarray:
    """Grouped-query attention of query positions start..start+seq-1, each over cached positions <= its own.

    q (seq, n_heads, head_dim); k_cache, v_cache (n_kv_heads, start+seq, head_dim)
    -> (seq, n_heads, head_dim). Sparse: each position selects its own keys (one `attention` per row).
    """
    if not mode.dense:
        return np.stack([attention(q[i], k_cache[:, : start + i + 1], v_cache[:, : start + i + 1], n_rep, mode)
                         for i in range(q.shape[0])])
    seq, n_heads, head_dim = q.shape
    qg = group_heads(q, k_cache.shape[0])  # (n_kv, n_rep, seq, head_dim)
    out = causal_probs(qg, k_cache, start) @ v_cache[:, None]  # (n_kv, n_rep, seq, head_dim)
    return out.transpose(2, 0, 1, 3).reshape(seq, n_heads, head_dim)


def group_heads(q: np.ndarray, n_kv: int) -> np.ndarray:
    """Query heads grouped by the K/V head they read: q (..., seq, n_heads, hd) -> (..., n_kv, n_rep, seq, hd)."""
    *lead, seq, n_heads, hd = q.shape
    qg = q.reshape(*lead, seq, n_kv, n_heads // n_kv, hd)  # (..., seq, n_kv, n_rep, hd)
    return np.moveaxis(qg, -4, -2)


def causal_probs(qg: np.ndarray, keys: np.ndarray, start: int) -> np.ndarray:
    """The causal softmax of grouped queries at positions start..start+seq-1 over keys at 0..total-1 (a key
    after its query gets probability 0). qg (..., n_kv, n_rep, seq, hd), keys (..., n_kv, total, hd)
    -> (..., n_kv, n_rep, seq, total)."""
    seq, head_dim = qg.shape[-2:]
    total = keys.shape[-2]
    scores = qg @ np.swapaxes(keys, -1, -2)[..., :, None, :, :]  # (..., n_kv, n_rep, seq, total)
    future = np.arange(total)[None, :] > (start + np.arange(seq))[:, None]  # (seq, total)
    return softmax(np.where(future, np.float32(-np.inf), scores * np.float32(1.0 / np.sqrt(head_dim))))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), written with tanh so large |x| never overflows exp."""
    half = np.float32(0.5)
    t = np.multiply(half, x)  # the same operations in the same order, in one buffer
    np.tanh(t, out=t)
    np.multiply(half, t, out=t)
    np.add(half, t, out=t)
    return np.multiply(x, t, out=t)


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """The Llama MLP: W_down @ (silu(W_gate @ x) * (W_up @ x)). x (..., dim) -> (..., dim)."""
    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)  # hidden (..., hidden_dim)


def route(h: np.ndarray, router: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The experts each row of h uses and their gates: h (T, dim), router (E, dim)
    -> experts (T, top_k) int, best first (ties to the lower index), gates (T, top_k) float32 summing to 1."""
    return top_k_gates(linear(h, router), top_k)  # logits (T, E)


def top_k_gates(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (T, E) -> the top_k experts of each row (T, top_k), best first (ties to the lower
    index), and their gates (T, top_k): a softmax over the chosen k."""
    experts = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]  # (T, top_k)
    return experts, softmax(np.take_along_axis(logits, experts, axis=-1))  # gates (T, top_k)


def moe_experts(h: np.ndarray, lw: LayerWeights, top_k: int) -> np.ndarray:
    """The experts' part of an MoE FFN: h (T, dim) -> (T, dim), each row the gated sum of its top_k experts."""
    experts, gates = route(h, lw.router, top_k)  # (T, top_k) each
    out = np.zeros_like(h)  # (T, dim)
    for e in range(lw.router.shape[0]):
        rows, slot = np.nonzero(experts == e)  # the rows that chose expert e, and in which slot
        if rows.size:
            y = swiglu(h[rows], lw.w_gate_exps[e], lw.w_up_exps[e], lw.w_down_exps[e])  # (n, dim)
            out[rows] += gates[rows, slot, None] * y
    return out


def ffn(h: np.ndarray, lw: LayerWeights, config: LlamaConfig) -> np.ndarray:
    """A layer's FFN of a normed hidden state: dense SwiGLU, or MoE (+ shared expert). h (..., dim) -> (..., dim)."""
    if not config.moe:
        return swiglu(h, lw.w_gate, lw.w_up, lw.w_down)
    out = moe_experts(h.reshape(-1, h.shape[-1]), lw, config.top_k).reshape(h.shape)  # (..., dim)
    if config.shared_hidden_dim:
        out = out + swiglu(h, lw.w_gate, lw.w_up, lw.w_down)
    return out


def qkv_rope(
    h: np.ndarray, lw: LayerWeights, config: LlamaConfig, cos: np.ndarray, sin: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Project a normed hidden state to per-head q, k, v and rotate q, k.

    h (..., dim); cos, sin broadcastable to (..., 1, head_dim//2)
    -> q (..., n_heads, head_dim), k and v (..., n_kv_heads, head_dim).
    """
    lead, hd = h.shape[:-1], config.head_dim
    q = linear(h, lw.wq).reshape(*lead, config.n_heads, hd)
    k = linear(h, lw.wk).reshape(*lead, config.n_kv_heads, hd)
    v = linear(h, lw.wv).reshape(*lead, config.n_kv_heads, hd)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


@dataclass(frozen=True, eq=False)
class Layer:
    """One decoder layer as the reference runs it: its weights, the model's shape, dense or sparse attention."""

    weights: LayerWeights
    config: LlamaConfig
    mode: AttentionMode = DENSE

    def __post_init__(self) -> None:
        if self.weights.wq.shape[1] != self.config.dim:
            raise ValueError(f"layer weights of width {self.weights.wq.shape[1]} do not fit a model of dim "
                             f"{self.config.dim}; load the weights of this config")


@dataclass(frozen=True, eq=False)
class Rope:
    """The position(s) a layer runs at and their RoPE cos, sin: pos an int with cos, sin (head_dim//2,),
    or positions (seq,) with cos, sin (seq, head_dim//2)."""

    pos: int | np.ndarray
    cos: np.ndarray
    sin: np.ndarray

    def __post_init__(self) -> None:
        if self.cos.shape != self.sin.shape or self.cos.shape[:-1] != np.shape(self.pos):
            raise ValueError(f"RoPE cos {self.cos.shape} and sin {self.sin.shape} do not match positions of "
                             f"shape {np.shape(self.pos)}; build them with Rope.at(pos, config)")

    @classmethod
    def at(cls, pos: int | np.ndarray, config: LlamaConfig) -> Rope:
        """The RoPE of `pos` (an int or an array of positions) for `config`'s heads."""
        return cls(pos, *rope_cos_sin(pos, config.head_dim, config.rope_theta))


def layer_forward(x: np.ndarray, layer: Layer, k_cache: np.ndarray, v_cache: np.ndarray, rope: Rope) -> np.ndarray:
    """One decoder layer for one token at `rope.pos`: x (dim,) -> (dim,).

    Writes this token's k, v into k_cache/v_cache (n_kv_heads, capacity, head_dim) at `pos` and attends over
    positions 0..pos. rope.cos, rope.sin are (head_dim//2,).
    """
    lw, config, pos = layer.weights, layer.config, rope.pos
    h = rmsnorm(x, lw.attn_norm, config.norm_eps)  # (dim,)
    q, k, v = qkv_rope(h, lw, config, rope.cos, rope.sin)  # (n_heads, hd), (n_kv, hd), (n_kv, hd)
    k_cache[:, pos] = k
    v_cache[:, pos] = v
    n_rep = config.n_heads // config.n_kv_heads
    a = attention(q, k_cache[:, : pos + 1], v_cache[:, : pos + 1], n_rep, layer.mode)  # (n_heads, hd)
    x = x + linear(a.reshape(-1), lw.wo)  # (dim,)
    return x + ffn(rmsnorm(x, lw.ffn_norm, config.norm_eps), lw, config)


def layer_prefill(x: np.ndarray, layer: Layer, k_cache: np.ndarray, v_cache: np.ndarray, rope: Rope,
                  keep: dict | None = None) -> np.ndarray:
    """One decoder layer for tokens at positions rope.pos = start..start+seq-1: x (seq, dim) -> (seq, dim).

    The batched twin of layer_forward; rope.cos, rope.sin are (seq, head_dim//2). Given a dict `keep`, the
    layer leaves in it the activations its backward pass reads (``model.backward``): h (seq, dim), q
    (seq, n_heads, hd), a (seq, n_heads*hd), x1 (seq, dim), h2 (seq, dim); k, v are in the caches.
    """
    lw, config = layer.weights, layer.config
    seq = x.shape[0]
    start = int(rope.pos[0])
    end = start + seq
    h = rmsnorm(x, lw.attn_norm, config.norm_eps)  # (seq, dim)
    q, k, v = qkv_rope(h, lw, config, rope.cos[:, None], rope.sin[:, None])  # (seq, n_heads|n_kv, hd)
    k_cache[:, start:end] = k.transpose(1, 0, 2)
    v_cache[:, start:end] = v.transpose(1, 0, 2)
    n_rep = config.n_heads // config.n_kv_heads
    a = causal_attention(q, k_cache[:, :end], v_cache[:, :end], n_rep, start, layer.mode)  # (seq, n_heads, hd)
    x1 = x + linear(a.reshape(seq, -1), lw.wo)  # (seq, dim)
    h2 = rmsnorm(x1, lw.ffn_norm, config.norm_eps)  # (seq, dim)
    if keep is not None:
        keep.update(h=h, q=q, a=a.reshape(seq, -1), x1=x1, h2=h2)
    return x1 + ffn(h2, lw, config)


def layer_batch(x: np.ndarray, layer: Layer, caches: list, index: int, rope: Rope) -> np.ndarray:
    """One decoder layer (number `index` of the model) for one token of each of B requests (each its own
    cache and position rope.pos[b]): x (B, dim) -> (B, dim). The projections and the MLP run batched (the
    weights are read once for all B); attention runs per request over its own cache. rope.cos (B, hd//2)."""
    lw, config = layer.weights, layer.config
    h = rmsnorm(x, lw.attn_norm, config.norm_eps)  # (B, dim)
    q, k, v = qkv_rope(h, lw, config, rope.cos[:, None], rope.sin[:, None])  # (B, n_heads|n_kv, hd)
    n_rep = config.n_heads // config.n_kv_heads
    a = np.empty_like(q)  # (B, n_heads, hd)
    for b, (cache, pos) in enumerate(zip(caches, rope.pos.tolist(), strict=True)):
        cache.k[index][:, pos], cache.v[index][:, pos] = k[b], v[b]
        a[b] = attention(q[b], cache.k[index][:, : pos + 1], cache.v[index][:, : pos + 1], n_rep, layer.mode)
    x = x + linear(a.reshape(len(x), -1), lw.wo)  # (B, dim)
    return x + ffn(rmsnorm(x, lw.ffn_norm, config.norm_eps), lw, config)


class ReferenceModel:
    """A Llama decoder in plain numpy, one process, float32. `step` and `prefill` return logits (vocab,).

    `attention` is dense (the default) or sparse (`AttentionMode.parse("sparse:64")`), in every phase."""

    def __init__(self, config: LlamaConfig, weights: LlamaWeights, attention: AttentionMode = DENSE) -> None:
        weights.check(config)
        self.config = config
        self.weights = weights
        self.attention = attention

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.config, capacity)

    def _check_token(self, token_id: int) -> None:
        if not 0 <= token_id < self.config.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary 0..{self.config.vocab_size - 1}")

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """Final norm and LM head: x (..., dim) -> logits (..., vocab)."""
        return linear(rmsnorm(x, self.weights.final_norm, self.config.norm_eps), self.weights.head)

    def step(self, token_id: int, pos: int, cache: KVCache) -> np.ndarray:
        """Run token `token_id` at position `pos`; returns the next-token logits (vocab,) float32."""
        self._check_token(token_id)
        cache.check_start(pos)
        cache.reserve(pos + 1)
        config = self.config
        rope = Rope.at(pos, config)  # cos, sin (hd//2,) each
        x = self.weights.embed[token_id]  # (dim,)
        for i, lw in enumerate(self.weights.layers):
            x = layer_forward(x, Layer(lw, config, self.attention), cache.k[i], cache.v[i], rope)
        cache.length = pos + 1
        return self._logits(x)

    def step_batch(self, tokens: Sequence[int], poss: Sequence[int], caches: list[KVCache]) -> np.ndarray:
        """One token for each of B requests at once (request b: token tokens[b] at poss[b] in caches[b]);
        returns the logits (B, vocab). Equal to B calls of ``step``, to float32 rounding."""
        for t, pos, cache in zip(tokens, poss, caches, strict=True):
            self._check_token(t)
            cache.check_start(pos)
            cache.reserve(pos + 1)
        config, poss = self.config, np.asarray(poss)
        rope = Rope.at(poss, config)  # cos, sin (B, hd//2) each
        x = self.weights.embed[np.asarray(tokens)]  # (B, dim)
        for i, lw in enumerate(self.weights.layers):
            x = layer_batch(x, Layer(lw, config, self.attention), caches, i, rope)
        for pos, cache in zip(poss.tolist(), caches, strict=True):
            cache.length = pos + 1
        return self._logits(x)

    def prefill(self, ids: Sequence[int], cache: KVCache) -> np.ndarray:
        """Run `ids` at positions cache.length.. in one batch; returns the logits (vocab,) after the last."""
        if len(ids) == 0:
            raise ValueError("prefill needs at least one token id")
        for t in ids:
            self._check_token(t)
        config, start = self.config, cache.length
        cache.reserve(start + len(ids))
        rope = Rope.at(np.arange(start, start + len(ids)), config)  # cos, sin (seq, hd//2) each
        x = self.weights.embed[np.asarray(ids)]  # (seq, dim)
        for i, lw in enumerate(self.weights.layers):
            x = layer_prefill(x, Layer(lw, config, self.attention), cache.k[i], cache.v[i], rope)
        cache.length = start + len(ids)
        return self._logits(x[-1])

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampler: Sampler | None = None,
        stop_ids: Sequence[int] = (),
    ) -> Iterator[int]:
        """Prefill the prompt, then yield up to max_new_tokens sampled ids, stopping after a stop id."""
        sampler = sampler or Sampler()
        rng = sampler.rng()
        cache = self.new_cache(capacity=len(prompt_ids) + max_new_tokens)
        logits = self.prefill(prompt_ids, cache)
        for _ in range(max_new_tokens):
            token = sampler.sample(logits, rng)
            yield token
            if token in stop_ids or cache.length >= self.config.max_seq_len:
                return
            logits = self.step(token, cache.length, cache)
