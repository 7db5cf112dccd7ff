"""The reference decoder's K/V cache: one request's keys and values per layer, grown as its positions come.

Contract: ``KVCache(config, capacity)`` holds ``k[layer]``, ``v[layer]`` (n_kv_heads, capacity, head_dim)
float32; positions 0..length-1 are valid (the decoder sets ``length`` after each run). ``reserve(n)`` makes
room for positions 0..n-1 (doubling, at most the model's context; beyond it a ValueError naming the
position); ``check_start(pos)`` refuses a run that would leave a gap. waferrt.model.reference's
``ReferenceModel`` fills it (``new_cache``); the wafer's own K/V lives in its cores (waferrt.decode.kvcache).
"""

from __future__ import annotations

import numpy as np

from waferrt.model.config import LlamaConfig


class KVCache:
    """Per-layer K and V of one request: k[layer], v[layer] are (n_kv_heads, capacity, head_dim) float32.

    Positions 0..length-1 are valid. Capacity grows by doubling, up to config.max_seq_len.
    """

    def __init__(self, config: LlamaConfig, capacity: int = 256) -> None:
        self.config = config
        self.length = 0
        capacity = min(capacity, config.max_seq_len)
        shape = (config.n_kv_heads, capacity, config.head_dim)
        self.k = [np.zeros(shape, dtype=np.float32) for _ in range(config.n_layers)]
        self.v = [np.zeros(shape, dtype=np.float32) for _ in range(config.n_layers)]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    def reserve(self, n: int) -> None:
        """Make room for positions 0..n-1."""
        if n > self.config.max_seq_len:
            raise ValueError(
                f"position {n - 1} is beyond the model's context of {self.config.max_seq_len} tokens; "
                "start a new request or shorten the prompt"
            )
        if n <= self.capacity:
            return
        new_cap = min(max(n, 2 * self.capacity), self.config.max_seq_len)
        for caches in (self.k, self.v):
            for i, old in enumerate(caches):
                grown = np.zeros((old.shape[0], new_cap, old.shape[2]), dtype=np.float32)
                grown[:, : self.length] = old[:, : self.length]
                caches[i] = grown

    def check_start(self, pos: int) -> None:
        """New tokens may extend the cache or rewrite it from `pos` on, but never leave a gap."""
        if not 0 <= pos <= self.length:
            raise ValueError(
                f"position {pos} would leave a gap: the cache holds positions 0..{self.length - 1}; "
                f"decode the next token at pos={self.length} (or a smaller pos to rewind)"
            )
