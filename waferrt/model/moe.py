"""A dense Llama cut into a mixture of experts: the project's own MoE models (SmolLM2-MoE).

Contract: ``cut_into_experts(config, weights, cut)`` returns (config, weights) of an MoE whose every
layer's FFN is the dense one's hidden units cut into ``cut.n_experts`` consecutive pieces of equal width,
each piece a SwiGLU expert, and a router (n_experts, dim). Each expert's down projection is scaled by
n_experts, so with ``top_k = n_experts`` and a zero router (``cut.seed is None``: every gate 1/n_experts)
the MoE computes the dense FFN (to float32 rounding: the sum is split in pieces); with a seeded router
(N(0, gain^2/dim) rows) and top_k < n_experts it is a real MoE whose routes vary by token, each chosen
expert standing in for n_experts/top_k of them. Attention, norms and embeddings are the dense model's
arrays (not copies). Pure numpy: reading and writing the files is the caller's (``waferrt convert``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .config import LlamaConfig
from .weights import LayerWeights, LlamaWeights


@dataclass(frozen=True)
class ExpertCut:
    """How to cut a dense FFN: n_experts pieces, top_k used per token, the router's seed (None: zero)."""

    n_experts: int
    top_k: int
    seed: int | None = 0
    gain: float = 4.0  # the router's logits' scale (larger: sharper gates)

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k} must be 1..n_experts ({self.n_experts}): each token uses "
                             "top_k of the experts, e.g. --moe 8,2")


def expert_config(config: LlamaConfig, cut: ExpertCut) -> LlamaConfig:
    """The config of the dense `config` cut into experts (its weights not needed: checked before they load);
    ValueError when the model already is an MoE or its FFN does not cut into equal experts."""
    if config.moe:
        raise ValueError(f"the model already is a mixture of {config.n_experts} experts; cut a dense model")
    if config.hidden_dim % cut.n_experts:
        raise ValueError(f"the FFN's {config.hidden_dim} hidden units do not cut into {cut.n_experts} equal "
                         f"experts; choose n_experts dividing {config.hidden_dim}")
    return dataclasses.replace(config, hidden_dim=config.hidden_dim // cut.n_experts, n_experts=cut.n_experts,
                               top_k=cut.top_k)


def cut_into_experts(config: LlamaConfig, weights: LlamaWeights, cut: ExpertCut) -> tuple[LlamaConfig, LlamaWeights]:
    """The MoE `cut` makes of a dense model (see the module's contract)."""
    moe_config = expert_config(config, cut)
    rng = np.random.default_rng(cut.seed)
    layers = tuple(_cut_layer(lw, cut, rng) for lw in weights.layers)
    out = dataclasses.replace(weights, layers=layers)
    out.check(moe_config)
    return moe_config, out


def _cut_layer(lw: LayerWeights, cut: ExpertCut, rng: np.random.Generator) -> LayerWeights:
    e, dim = cut.n_experts, lw.ffn_norm.shape[0]
    if cut.seed is None:
        router = np.zeros((e, dim), np.float32)
    else:
        router = rng.standard_normal((e, dim), dtype=np.float32) * np.float32(cut.gain / np.sqrt(dim))  # (E, dim)
    return dataclasses.replace(
        lw, w_gate=None, w_up=None, w_down=None, router=router,
        w_gate_exps=_pieces(lw.w_gate, e, axis=0),  # (E, hidden/E, dim)
        w_up_exps=_pieces(lw.w_up, e, axis=0),  # (E, hidden/E, dim)
        w_down_exps=_pieces(lw.w_down * np.float32(e), e, axis=1))  # (E, dim, hidden/E)


def _pieces(w: np.ndarray, n: int, axis: int) -> np.ndarray:
    """w cut into n equal consecutive pieces along `axis`, stacked on a new first axis (float32, C order)."""
    return np.ascontiguousarray(np.stack(np.split(np.asarray(w, np.float32), n, axis=axis)))
