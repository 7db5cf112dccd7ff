"""LlamaConfig: the shape of a Llama-architecture decoder, as one frozen value.

Contract: pure data (no arrays). Everything that plans or runs a model (the numpy reference, the
scheduler's SRAM planning, the wafer decode) reads the model's dimensions from here.
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
    hidden_dim: int  # SwiGLU inner width
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
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

    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, MLP, two RMSNorm weights)."""
        attn = self.dim * self.dim * 2 + self.dim * self.kv_dim * 2
        mlp = 3 * self.dim * self.hidden_dim
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
