"""The anchor the wafer is measured against: the fastest plain numpy decode of a Llama we could write.

Contract: :class:`Anchor` keeps every layer's matrices float32 and C-contiguous -- q|k|v fused into one
(q_dim + 2 kv_dim, dim) and gate|up into one (2 hidden, dim) -- and the tied head as (vocab, dim), so every
linear layer of a step is ONE batched BLAS call for all B requests together: over panels of 64 output rows
(waferrt.decode.net.matmul_rows, the same call the tiles make; 1.5-2x faster than one call over the
whole matrix at a few tokens). ``Anchor(..., panels=False)`` is the anchor issue 18 describes instead:
(in, out) matrices, ``x @ W`` over the whole matrix (the benchmark shows it is not faster). K/V are
preallocated per layer as (requests, n_kv, capacity, head_dim) and written in place; attention is one
batched matmul over the requests (each masked to its own positions). ``generate(requests)`` decodes them
greedily together: every prompt token of every request in one batched prefill pass, then one step per
token for the requests still going. It runs in the calling process with whatever BLAS threads it has:
the benchmark sets one (OPENBLAS_NUM_THREADS=1 before numpy loads), like a tile. The math is the
reference's (waferrt.model.reference: RMSNorm, RoPE on adjacent pairs, SiLU), so its tokens equal it.
"""

from __future__ import annotations

import time

import numpy as np

from waferrt.decode.net import matmul_rows
from waferrt.model.config import LlamaConfig
from waferrt.model.reference import apply_rope, rmsnorm, rope_cos_sin, silu
from waferrt.model.weights import LlamaWeights
from waferrt.serving.requests import GenRequest


class Anchor:
    def __init__(self, config: LlamaConfig, weights: LlamaWeights, panels: bool = True):
        self.config = config
        self.panels = panels

        def fused(*mats: np.ndarray) -> np.ndarray:  # (out_k, in) -> one (sum out_k, in), or (in, sum out_k)
            w = np.concatenate(mats, axis=0)
            return np.ascontiguousarray(w if panels else w.T, dtype=np.float32)

        self.layers = [(lw.attn_norm, fused(lw.wq, lw.wk, lw.wv), fused(lw.wo), lw.ffn_norm,
                        fused(lw.w_gate, lw.w_up), fused(lw.w_down)) for lw in weights.layers]
        self.embed, self.final_norm, self.head = weights.embed, weights.final_norm, fused(weights.head)
        self.rep = config.n_heads // config.n_kv_heads
        self.scale = np.float32(1.0 / np.sqrt(config.head_dim))
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []

    def _mm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return matmul_rows(w, x) if self.panels else x @ w

    def _alloc(self, requests: int, capacity: int) -> None:
        shape = (requests, self.config.n_kv_heads, capacity, self.config.head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in self.layers]
        self.v = [np.zeros(shape, np.float32) for _ in self.layers]

    def _attention(self, i: int, q: np.ndarray, reqs: np.ndarray, poss: np.ndarray) -> np.ndarray:
        """q (N, nh, hd) of items (request reqs[n] at position poss[n]) over their requests' cached positions
        <= their own -> (N, nh * hd)."""
        N, hd, L = len(reqs), self.config.head_dim, int(poss.max()) + 1
        every = N == len(self.k[i]) and (reqs == np.arange(N)).all()  # one item per request: no gather
        k = self.k[i][:, :, :L] if every else self.k[i][reqs, :, :L]  # (N, nkv, L, hd)
        v = self.v[i][:, :, :L] if every else self.v[i][reqs, :, :L]
        qg = q.reshape(N, -1, self.rep, hd)  # (N, nkv, rep, hd)
        scores = np.matmul(qg, k.transpose(0, 1, 3, 2)) * self.scale  # (N, nkv, rep, L)
        future = np.arange(L)[None, :] > poss[:, None]  # (N, L)
        scores = np.where(future[:, None, None], np.float32(-np.inf), scores)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        return np.matmul(p, v).reshape(N, -1)  # (N, nkv, rep, hd) -> (N, nh * hd)

    def forward(self, tokens: np.ndarray, reqs: np.ndarray, poss: np.ndarray) -> np.ndarray:
        """Items (token, request, position) through every layer, their K/V written -> hidden (N, dim)."""
        config, nh, nkv, hd = self.config, self.config.n_heads, self.config.n_kv_heads, self.config.head_dim
        cos, sin = rope_cos_sin(poss, hd, config.rope_theta)  # (N, hd/2)
        cos, sin = cos[:, None], sin[:, None]
        x = self.embed[tokens]  # (N, dim)
        for i, (an, wqkv, wo, fn, w13, w2) in enumerate(self.layers):
            qkv = self._mm(rmsnorm(x, an, config.norm_eps), wqkv)  # (N, (nh + 2 nkv) hd)
            q = apply_rope(qkv[:, :nh * hd].reshape(-1, nh, hd), cos, sin)
            self.k[i][reqs, :, poss] = apply_rope(qkv[:, nh * hd:(nh + nkv) * hd].reshape(-1, nkv, hd), cos, sin)
            self.v[i][reqs, :, poss] = qkv[:, (nh + nkv) * hd:].reshape(-1, nkv, hd)
            x = x + self._mm(self._attention(i, q, reqs, poss), wo)
            gu = self._mm(rmsnorm(x, fn, config.norm_eps), w13)  # (N, 2 hidden)
            x = x + self._mm(silu(gu[:, :config.hidden_dim]) * gu[:, config.hidden_dim:], w2)
        return x

    def next_tokens(self, x: np.ndarray) -> np.ndarray:
        """Greedy: the final norm, the head as one matmul, the argmax of each row (N,)."""
        return np.argmax(self._mm(rmsnorm(x, self.final_norm, self.config.norm_eps), self.head), axis=-1)

    def generate(self, requests: list[GenRequest]) -> tuple[list[list[int]], float, list[float]]:
        """Greedy decode of `requests` together -> (tokens per request, wall seconds, seconds per step)."""
        self._alloc(len(requests), max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
        t0 = time.perf_counter()
        reqs = np.concatenate([np.full(len(r.prompt_ids), b) for b, r in enumerate(requests)])
        poss = np.concatenate([np.arange(len(r.prompt_ids)) for r in requests])
        x = self.forward(np.concatenate([r.prompt_ids for r in requests]), reqs, poss)
        last = np.cumsum([len(r.prompt_ids) for r in requests]) - 1
        out = [[int(t)] for t in self.next_tokens(x[last])]
        live, steps = np.array([b for b, r in enumerate(requests) if r.max_new_tokens > 1]), []
        while len(live):
            t1 = time.perf_counter()
            tokens = np.array([out[b][-1] for b in live])
            poss = np.array([len(requests[b].prompt_ids) + len(out[b]) - 1 for b in live])
            for b, t in zip(live, self.next_tokens(self.forward(tokens, live, poss)), strict=True):
                out[b].append(int(t))
            live = np.array([b for b in live if len(out[b]) < requests[b].max_new_tokens], np.int64)
            steps.append(time.perf_counter() - t1)
        return out, time.perf_counter() - t0, steps
