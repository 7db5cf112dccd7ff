"""LlamaConfig: the shape of a Llama-architecture decoder, as one frozen value.

Contract: pure data (no arrays). Everything that plans or runs a model (the numpy reference, the
scheduler's SRAM planning, the wafer decode) reads the model's dimensions from here.

A mixture of experts (Mixtral-style) has ``n_experts`` > 0: every layer's FFN is a router choosing
``top_k`` of ``n_experts`` SwiGLU experts of width ``hidden_dim`` each, plus, when ``shared_hidden_dim`` > 0,
one shared SwiGLU expert that every token passes (Qwen-MoE, DeepSeek). The defaults are a dense model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    dim: int  # model width (embedding size)
    n_layers: int
    n_heads: int
    n_kv_heads: int  # grouped-query attention: n_heads // n_kv_heads query heads share one K/V head
    hidden_dim: int  # SwiGLU inner width (of each expert when n_experts > 0)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = True
    n_experts: int = 0  # 0: a dense FFN; else the experts of each layer's MoE FFN
    top_k: int = 0  # experts each token uses (1..n_experts for an MoE, 0 for a dense model)
    shared_hidden_dim: int = 0  # width of the MoE's shared expert (0: none)

    def __post_init__(self) -> None:
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k} must be 1..n_experts ({self.n_experts}): each token uses "
                             "top_k of the experts")
        if not self.n_experts and (self.top_k or self.shared_hidden_dim):
            raise ValueError(f"top_k {self.top_k} / shared_hidden_dim {self.shared_hidden_dim} need n_experts "
                             "> 0 (a dense model has neither)")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    @property
    def dense_hidden(self) -> int:
        """Width of the FFN every token passes: the dense FFN, or the MoE's shared expert (0: none)."""
        return self.shared_hidden_dim if self.moe else self.hidden_dim

    def layer_params(self, active: bool = False) -> int:
        """Parameters of one decoder layer (attention, FFN, two RMSNorm weights); `active`: only those one
        token uses (top_k experts of an MoE)."""
        attn = self.dim * self.dim * 2 + self.dim * self.kv_dim * 2
        experts = self.top_k if active else self.n_experts
        mlp = 3 * self.dim * (self.dense_hidden + experts * self.hidden_dim) + self.n_experts * self.dim
        return attn + mlp + 2 * self.dim

    def params(self) -> int:
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.vocab_size * self.dim + head + self.n_layers * self.layer_params() + self.dim


SMOLLM2_135M = LlamaConfig(
    vocab_size=49152,
    dim=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    hidden_dim=1536,
    rope_theta=100000.0,
    norm_eps=1e-5,
    max_seq_len=8192,
    tie_embeddings=True,
)
