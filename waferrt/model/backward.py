"""The backward pass of the reference Llama (numpy): cross-entropy loss and the gradient of every weight.

Contract:
- ``loss_and_grads(config, weights, tokens) -> (loss, grads)``: tokens (B, S+1) ints; each row's first S
  tokens are the inputs and its last S the targets (next-token prediction). loss is the mean cross-entropy
  over the B*S positions (a Python float); grads maps every weight's name (``named_arrays``: "embed",
  "layers[i].wq", ..., "final_norm", and "head" when untied) to its gradient, of the weight's shape. A tied
  head's gradient is added into "embed". The arrays keep the weights' dtype: float32 for training, float64
  for a finite-difference check of this very code.
- The forward is the reference's own: ``reference.layer_prefill`` runs each sequence of each layer and
  keeps its activations (h, q, a, x1, h2; k, v in its caches). The FFN's gate and up products and the
  attention's probabilities are recomputed in the backward from what was kept (``causal_probs``, the
  forward's own function).
- One function per phase of a training step, so that a wafer (mesh kernels, weight streaming) can run them
  one layer at a time: ``embed_forward``, ``block_forward`` (a layer, activations kept in a ``Saved``),
  ``head_loss`` (final norm, tied/untied head, cross-entropy and their backward), ``block_backward`` (a
  layer's input gradient and weight gradients) and ``embed_backward``.
- Dense models only: an MoE config (router, experts) raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.model.config import LlamaConfig
from waferrt.model.reference import (
    Layer,
    Rope,
    apply_rope,
    causal_probs,
    group_heads,
    layer_prefill,
    linear,
    rmsnorm,
    silu,
    softmax,
)
from waferrt.model.weights import LayerWeights, LlamaWeights


def named_arrays(weights: LlamaWeights) -> dict[str, np.ndarray]:
    """Every distinct weight array by name, as ``weights.synthetic_tensors`` names them (a tied head is
    "embed" only)."""
    out = {"embed": weights.embed}
    for i, layer in enumerate(weights.layers):
        out.update({f"layers[{i}].{f}": a for f, a in layer.arrays().items()})
    out["final_norm"] = weights.final_norm
    if not weights.tied:
        out["head"] = weights.head
    return out


@dataclass(frozen=True, eq=False)
class Saved:
    """What a layer's forward keeps for its backward, for B sequences of S tokens: x (B, S, dim) its input,
    h (B, S, dim) the attention's normed input, q (B, S, n_heads, hd) and k (B, S, n_kv, hd) after RoPE,
    v (B, S, n_kv, hd), a (B, S, n_heads*hd) the attention's output, x1 (B, S, dim) the residual after
    attention and h2 (B, S, dim) the FFN's normed input."""

    x: np.ndarray
    h: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    a: np.ndarray
    x1: np.ndarray
    h2: np.ndarray

    def __post_init__(self) -> None:
        if self.x.ndim != 3 or self.q.shape[:2] != self.x.shape[:2]:
            raise ValueError(f"Saved activations are (B, S, ...): x {self.x.shape}, q {self.q.shape}")


def check_dense(config: LlamaConfig) -> None:
    """Training runs dense models: an MoE config raises ValueError naming what to give instead."""
    if config.moe:
        raise ValueError(f"training has no backward for a mixture of experts ({config.n_experts} experts, top "
                         f"{config.top_k}); train a dense Llama (n_experts=0), e.g. --model tiny or smollm2")


def embed_forward(embed: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """The embedding rows of the inputs: embed (vocab, dim), inputs (B, S) -> x (B, S, dim)."""
    return embed[inputs]


def block_forward(x: np.ndarray, layer: Layer, rope: Rope) -> tuple[np.ndarray, Saved]:
    """One layer over B sequences (``reference.layer_prefill`` on each), keeping its activations:
    x (B, S, dim) -> y (B, S, dim), Saved. rope: positions 0..S-1."""
    config, (B, S, _) = layer.config, x.shape
    shape = (B, config.n_kv_heads, S, config.head_dim)
    k_cache, v_cache = np.zeros(shape, x.dtype), np.zeros(shape, x.dtype)  # (B, n_kv, S, hd) each
    ys, kept = [], []
    for b in range(B):
        keep: dict = {}
        ys.append(layer_prefill(x[b], layer, k_cache[b], v_cache[b], rope, keep))
        kept.append(keep)
    stack = {name: np.stack([k[name] for k in kept]) for name in kept[0]}
    k, v = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)  # (B, S, n_kv, hd) each
    return np.stack(ys), Saved(x=x, k=k, v=v, **stack)


def rmsnorm_backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of y = rmsnorm(x, w): dy, x (..., dim), w (dim,) -> dx (..., dim), dw (dim,)."""
    r = np.float32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))  # (..., 1)
    n = x * r  # (..., dim) the normed x
    dn = dy * w  # (..., dim)
    dx = r * (dn - n * np.mean(dn * n, axis=-1, keepdims=True))
    return dx, np.sum((dy * n).reshape(-1, x.shape[-1]), axis=0)


def linear_backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of y = linear(x, w): dy (..., out), x (..., in), w (out, in) -> dx (..., in), dw (out, in)."""
    return dy @ w, dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])


def swiglu_backward(dy: np.ndarray, h2: np.ndarray, lw: LayerWeights) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Gradients of the dense SwiGLU of h2 (..., dim): dy (..., dim) -> dh2 (..., dim), {w_gate, w_up, w_down}.
    The gate and up products are recomputed from h2."""
    g, u = linear(h2, lw.w_gate), linear(h2, lw.w_up)  # (..., hidden) each
    half = np.float32(0.5)
    s = half + half * np.tanh(half * g)  # sigmoid(g)
    dm, dw_down = linear_backward(dy, silu(g) * u, lw.w_down)  # (..., hidden)
    dg = dm * u * s * (np.float32(1.0) + g * (np.float32(1.0) - s))  # silu'(g) = s (1 + g (1 - s))
    dh_gate, dw_gate = linear_backward(dg, h2, lw.w_gate)
    dh_up, dw_up = linear_backward(dm * silu(g), h2, lw.w_up)
    return dh_gate + dh_up, {"w_gate": dw_gate, "w_up": dw_up, "w_down": dw_down}


def attention_backward(da: np.ndarray, saved: Saved, config: LlamaConfig) -> tuple[np.ndarray, ...]:
    """Gradients of causal grouped-query attention: da (B, S, n_heads, hd) -> dq (B, S, n_heads, hd),
    dk, dv (B, S, n_kv, hd), with respect to the rotated q and k. The probabilities are recomputed."""
    B, S, n_heads, hd = saved.q.shape
    n_kv = config.n_kv_heads
    qg = group_heads(saved.q, n_kv)  # (B, n_kv, n_rep, S, hd)
    k, v = saved.k.transpose(0, 2, 1, 3), saved.v.transpose(0, 2, 1, 3)  # (B, n_kv, S, hd) each
    p = causal_probs(qg, k, 0)  # (B, n_kv, n_rep, S, S)
    dog = group_heads(da, n_kv)  # (B, n_kv, n_rep, S, hd)
    dv = np.sum(np.swapaxes(p, -1, -2) @ dog, axis=2)  # (B, n_kv, S, hd): summed over the query heads
    dp = dog @ np.swapaxes(v, -1, -2)[:, :, None]  # (B, n_kv, n_rep, S, S)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * np.float32(1.0 / np.sqrt(hd))  # d(scores)
    dqg = ds @ k[:, :, None]  # (B, n_kv, n_rep, S, hd)
    dk = np.sum(np.swapaxes(ds, -1, -2) @ qg, axis=2)  # (B, n_kv, S, hd)
    dq = np.moveaxis(dqg, -2, -4).reshape(B, S, n_heads, hd)
    return dq, dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)


def block_backward(dy: np.ndarray, saved: Saved, layer: Layer, rope: Rope) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One layer's backward: dy (B, S, dim), the gradient of its output -> dx (B, S, dim), the gradient of its
    input, and the gradients of its weights by field name (attn_norm, wq, ..., w_down)."""
    lw, config = layer.weights, layer.config
    check_dense(config)
    B, S, _ = dy.shape
    dh2, grads = swiglu_backward(dy, saved.h2, lw)  # FFN: y = x1 + swiglu(rmsnorm(x1))
    dx1, grads["ffn_norm"] = rmsnorm_backward(dh2, saved.x1, lw.ffn_norm, config.norm_eps)
    dx1 = dx1 + dy
    da, grads["wo"] = linear_backward(dx1, saved.a, lw.wo)  # attention: x1 = x + wo @ attn(rmsnorm(x))
    dq, dk, dv = attention_backward(da.reshape(saved.q.shape), saved, config)
    cos, sin = rope.cos[:, None], rope.sin[:, None]  # (S, 1, hd//2): RoPE's inverse turns by -angle
    dq, dk = apply_rope(dq, cos, -sin).reshape(B, S, -1), apply_rope(dk, cos, -sin).reshape(B, S, -1)
    dh_q, grads["wq"] = linear_backward(dq, saved.h, lw.wq)
    dh_k, grads["wk"] = linear_backward(dk, saved.h, lw.wk)
    dh_v, grads["wv"] = linear_backward(dv.reshape(B, S, -1), saved.h, lw.wv)
    dx, grads["attn_norm"] = rmsnorm_backward(dh_q + dh_k + dh_v, saved.x, lw.attn_norm, config.norm_eps)
    return dx + dx1, grads


def head_loss(x: np.ndarray, final_norm: np.ndarray, head: np.ndarray, targets: np.ndarray,
              config: LlamaConfig) -> tuple:
    """The final norm, the head (vocab, dim) and the mean cross-entropy, with their backward: x (B, S, dim),
    targets (B, S) -> (loss float, dx (B, S, dim), d final_norm (dim,), d head (vocab, dim))."""
    hf = rmsnorm(x, final_norm, config.norm_eps)  # (B, S, dim)
    logits = linear(hf, head)  # (B, S, vocab)
    p = softmax(logits)  # (B, S, vocab)
    picked = np.take_along_axis(p, targets[..., None], axis=-1)[..., 0]  # (B, S)
    loss = float(-np.mean(np.log(picked)))
    dlogits = p
    np.put_along_axis(dlogits, targets[..., None], picked[..., None] - 1, axis=-1)
    dlogits *= np.asarray(1.0 / targets.size, dtype=x.dtype)  # d(mean)
    dhf, dhead = linear_backward(dlogits, hf, head)
    dx, dnorm = rmsnorm_backward(dhf, x, final_norm, config.norm_eps)
    return loss, dx, dnorm, dhead


def embed_backward(dx: np.ndarray, inputs: np.ndarray, embed: np.ndarray) -> np.ndarray:
    """The embedding's gradient: dx (B, S, dim) added into the rows of the inputs (B, S) -> (vocab, dim)."""
    d = np.zeros_like(embed)
    np.add.at(d, inputs.reshape(-1), dx.reshape(-1, dx.shape[-1]))
    return d


def split_tokens(config: LlamaConfig, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tokens (B, S+1) -> inputs (B, S), targets (B, S); ValueError naming what does not fit."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integers of shape (B, S+1) with S >= 1, got {tokens.dtype} "
                         f"{tokens.shape}; the batcher gives such rows")
    if tokens.shape[1] - 1 > config.max_seq_len:
        raise ValueError(f"sequences of {tokens.shape[1] - 1} tokens exceed the model's context of "
                         f"{config.max_seq_len}; give a shorter --seq")
    if tokens.min() < 0 or tokens.max() >= config.vocab_size:
        raise ValueError(f"token ids must lie in 0..{config.vocab_size - 1}, got {tokens.min()}..{tokens.max()}")
    return tokens[:, :-1], tokens[:, 1:]


def loss_and_grads(config: LlamaConfig, weights: LlamaWeights, tokens: np.ndarray) -> tuple[float, dict]:
    """The mean next-token cross-entropy of tokens (B, S+1) and the gradient of every weight, by name
    (``named_arrays``' names); see the module docstring."""
    check_dense(config)
    inputs, targets = split_tokens(config, tokens)
    rope = Rope.at(np.arange(inputs.shape[1]), config)  # cos, sin (S, hd//2)
    layers = [Layer(lw, config) for lw in weights.layers]
    x, saved = embed_forward(weights.embed, inputs), []
    for layer in layers:
        x, s = block_forward(x, layer, rope)
        saved.append(s)
    loss, dx, dnorm, dhead = head_loss(x, weights.final_norm, weights.head, targets, config)
    grads = {"final_norm": dnorm}
    for i in reversed(range(len(layers))):
        dx, g = block_backward(dx, saved[i], layers[i], rope)
        grads.update({f"layers[{i}].{f}": a for f, a in g.items()})
    grads["embed"] = embed_backward(dx, inputs, weights.embed)
    if weights.tied:
        grads["embed"] += dhead
    else:
        grads["head"] = dhead
    return loss, {name: grads[name] for name in named_arrays(weights)}
