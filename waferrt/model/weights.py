"""LlamaWeights: the parameters of a Llama decoder as plain float32 numpy arrays.

Contract: every matrix is stored (out_features, in_features), C-contiguous float32, so a linear layer is
y = W @ x (for a batch of rows: x @ W.T). That is the GGUF's own numpy layout after dequantisation (the
GGUF lists ggml `ne` dims innermost-first, so `ne = [in, out]` reads as numpy shape (out, in)).
Q and K rows are in the GGUF (llama.cpp) order: RoPE rotates ADJACENT pairs (x[2i], x[2i+1]) of each
head. With tied embeddings, `head is embed` (one array, not a copy).
A layer holds the fields its config asks for and None for the others (`LayerWeights.shapes`): a dense
layer w_gate/w_up/w_down; an MoE layer the router (n_experts, dim) and the experts stacked on a first axis
(llama.cpp's ffn_*_exps), plus w_gate/w_up/w_down as its shared expert when it has one.

`synthetic_llama(config, seed)` builds seeded random weights whose activations stay O(1) (`synthetic_tensors`
yields them one array at a time, `assemble` joins such a stream), and
`tiny_config()` is a model small enough for millisecond unit tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

import numpy as np

from waferrt.model.config import LlamaConfig


@dataclass(frozen=True, eq=False)
class LayerWeights:
    attn_norm: np.ndarray  # (dim,)
    wq: np.ndarray  # (n_heads * head_dim, dim)
    wk: np.ndarray  # (kv_dim, dim)
    wv: np.ndarray  # (kv_dim, dim)
    wo: np.ndarray  # (dim, dim)
    ffn_norm: np.ndarray  # (dim,)
    w_gate: np.ndarray | None = None  # (dense_hidden, dim): the dense FFN or the shared expert
    w_up: np.ndarray | None = None  # (dense_hidden, dim)
    w_down: np.ndarray | None = None  # (dim, dense_hidden)
    router: np.ndarray | None = None  # (n_experts, dim)
    w_gate_exps: np.ndarray | None = None  # (n_experts, hidden_dim, dim)
    w_up_exps: np.ndarray | None = None  # (n_experts, hidden_dim, dim)
    w_down_exps: np.ndarray | None = None  # (n_experts, dim, hidden_dim)

    @staticmethod
    def shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
        """The shape of every field `config` asks for (the others are None)."""
        d, kv, s = config.dim, config.kv_dim, config.dense_hidden
        out = {
            "attn_norm": (d,),
            "wq": (config.n_heads * config.head_dim, d),
            "wk": (kv, d),
            "wv": (kv, d),
            "wo": (d, d),
            "ffn_norm": (d,),
        }
        if s:
            out.update(w_gate=(s, d), w_up=(s, d), w_down=(d, s))
        if config.moe:
            e, h = config.n_experts, config.hidden_dim
            out.update(router=(e, d), w_gate_exps=(e, h, d), w_up_exps=(e, h, d), w_down_exps=(e, d, h))
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """The fields that hold an array (what the config asks for), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True, eq=False)
class LlamaWeights:
    embed: np.ndarray  # (vocab, dim)
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray  # (dim,)
    head: np.ndarray  # (vocab, dim); the same object as `embed` when tied

    @property
    def tied(self) -> bool:
        return self.head is self.embed

    def check(self, config: LlamaConfig) -> None:
        """Raise ValueError naming the first array whose shape, dtype or layout does not fit `config`."""
        if len(self.layers) != config.n_layers:
            raise ValueError(f"weights have {len(self.layers)} layers but the config says {config.n_layers}")
        if self.tied != config.tie_embeddings:
            raise ValueError(
                f"config.tie_embeddings={config.tie_embeddings} but the weights are "
                f"{'tied' if self.tied else 'untied'} (head {'is' if self.tied else 'is not'} embed)"
            )
        top = {"embed": (config.vocab_size, config.dim), "final_norm": (config.dim,)}
        top["head"] = top["embed"]
        for name, shape in top.items():
            _check_array(name, getattr(self, name), shape)
        shapes = LayerWeights.shapes(config)
        for i, layer in enumerate(self.layers):
            extra = sorted(set(layer.arrays()) - set(shapes))
            if extra:
                raise ValueError(f"weight layers[{i}].{extra[0]} is set but the config has no such tensor "
                                 f"(n_experts={config.n_experts}, shared_hidden_dim={config.shared_hidden_dim})")
            for name, shape in shapes.items():
                _check_array(f"layers[{i}].{name}", getattr(layer, name), shape)

    def nbytes(self) -> int:
        """Bytes of all distinct arrays (a tied head counts once)."""
        arrays = {id(a): a for a in (self.embed, self.final_norm, self.head)}
        for layer in self.layers:
            arrays.update((id(a), a) for a in layer.arrays().values())
        return sum(a.nbytes for a in arrays.values())


def _check_array(name: str, a: np.ndarray | None, shape: tuple[int, ...]) -> None:
    if a is None:
        raise ValueError(f"weight {name} is missing; the config asks for shape {shape}")
    if a.shape != shape:
        raise ValueError(f"weight {name} has shape {a.shape}, expected {shape} (matrices are (out, in))")
    if a.dtype != np.float32:
        raise ValueError(f"weight {name} has dtype {a.dtype}; the reference model keeps float32 everywhere")
    if not a.flags.c_contiguous:
        raise ValueError(f"weight {name} is not C-contiguous; use np.ascontiguousarray(...) for fast GEMVs")


def tiny_config() -> LlamaConfig:
    """A Llama small enough that a decode step takes microseconds: for unit tests."""
    return LlamaConfig(
        vocab_size=256,
        dim=64,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=128,
        rope_theta=10000.0,
        norm_eps=1e-5,
        max_seq_len=128,
        tie_embeddings=True,
    )


def tiny_moe_config(n_experts: int = 4, top_k: int = 2, shared_hidden_dim: int = 0) -> LlamaConfig:
    """The tiny Llama with an MoE FFN: `n_experts` experts of width 32, `top_k` per token."""
    return dataclasses.replace(tiny_config(), hidden_dim=32, n_experts=n_experts, top_k=top_k,
                               shared_hidden_dim=shared_hidden_dim)


def synthetic_tensors(config: LlamaConfig, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """Seeded random weights with O(1) activations, one array at a time: ("embed", a), then
    ("layers[i].<field>", a) for every layer, ("final_norm", a), and ("head", a) when untied. A caller that
    writes them one by one (``model.convert``) never holds the whole model.

    Matrices are N(0, 1/in_features), so y = W @ x keeps the RMS of x; the embedding is N(0, 1/dim), so
    tied logits of a unit-RMS hidden state are O(1); norm weights are 1 + N(0, 0.1).
    """
    rng = np.random.default_rng(seed)

    def matrix(*shape: int) -> np.ndarray:  # (..., out, in)
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(1.0 / np.sqrt(shape[-1]))
        return w

    def norm(n: int) -> np.ndarray:
        return np.float32(1.0) + np.float32(0.1) * rng.standard_normal(n, dtype=np.float32)

    yield "embed", matrix(config.vocab_size, config.dim)
    for i in range(config.n_layers):
        for name, shape in LayerWeights.shapes(config).items():
            yield f"layers[{i}].{name}", norm(shape[0]) if len(shape) == 1 else matrix(*shape)
    yield "final_norm", norm(config.dim)
    if not config.tie_embeddings:
        yield "head", matrix(config.vocab_size, config.dim)


def assemble(config: LlamaConfig, tensors: Iterable[tuple[str, np.ndarray]]) -> LlamaWeights:
    """LlamaWeights from (name, array) pairs named as :func:`synthetic_tensors` names them, checked."""
    got = dict(tensors)
    layers = tuple(LayerWeights(**{f: got[f"layers[{i}].{f}"] for f in LayerWeights.shapes(config)})
                   for i in range(config.n_layers))
    embed = got["embed"]
    weights = LlamaWeights(embed=embed, layers=layers, final_norm=got["final_norm"], head=got.get("head", embed))
    weights.check(config)
    return weights


def synthetic_llama(config: LlamaConfig, seed: int = 0) -> LlamaWeights:
    """Seeded random weights with O(1) activations (:func:`synthetic_tensors`, assembled)."""
    return assemble(config, synthetic_tensors(config, seed))
