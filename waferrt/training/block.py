"""A Llama block's backward on a Wafer, as one composed mesh kernel: the seam a training loop calls per layer.

Contract: ``block_backward(wafer, config, weights, saved, dy) -> (dx, grads)`` runs the backward of one
dense Llama block (RMSNorm, the Q/K/V projections, RoPE, causal GQA attention, the output projection,
RMSNorm, SwiGLU) on the largest square of cores at the wafer's corner (``onwafer.living_square``, whose
cores must all live: the attention needs them): `weights` is the block's ``LayerWeights`` (float32, (out, in)),
`saved` its forward activations (:class:`Saved`, made by :func:`block_forward`), dy (T, dim) the gradient of
the block's output; it returns dx (T, dim) and the weight gradients keyed as ``LayerWeights``'s fields.

How: the host puts the weights (as weight streaming brings them in), the activations the forward kept and dy
into the square's SRAM, each in the layout the forward's MeshGEMMs left it (waferrt.kernels.gemm_backward:
a GEMM's input X in the A layout, its weight in the B layout, its output and the element-wise ops' operands
in the C layout; the attention's Q, K, V and output per head); one kernel (:func:`block_kernel`) then runs
every op's backward (waferrt.kernels.gemm_backward, attention_backward, train_ops), its intermediates
never leaving the cores, each layout change a skew on the mesh; the host reads dx and the gradients back.
The activations are kept, not recomputed -- but for the attention's P, which its backward recomputes
(S x S per sequence and head: see attention_backward) -- and must fit: ``onwafer.check_fits`` raises BlockTooLarge
naming a core and the bytes when they, the weights and the gradients do not. What the kernel books is each op's
closed form (waferrt.core.train_cost, tests/unit/test_block_backward.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import numpy as np

from waferrt.core.mesh import Region
from waferrt.core.train_cost import TrainShape, square_tokens
from waferrt.decode.kernel_net import KernelNet
from waferrt.kernels.attention import PromptAttention
from waferrt.kernels.attention_backward import attention_backward
from waferrt.kernels.gemm import Grid
from waferrt.kernels.gemm_backward import gather, grad_input, grad_weight, scatter
from waferrt.kernels.sequences import deinterleave, interleave
from waferrt.kernels.train_ops import Norm, relayout, rmsnorm_backward, rope_backward, swiglu_backward
from waferrt.model.reference import apply_rope, causal_attention, linear, rmsnorm, rope_cos_sin, silu

from .onwafer import Job, living_square, run_job

WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
ACTIVATIONS = ("x", "x2", "gate", "up", "q", "k", "v", "h1", "att", "h2", "m")  # "<kept><name>"
INPUTS = WEIGHTS + ("cos", "sin")  # the DSM tensors the kernel reads as "bb.<name>", with the kept and dy
FD_STEP = 1e-6  # finite_difference's step, in float64


@dataclass(frozen=True)
class Saved:
    """A block's forward activations (T tokens: B sequences of `seq` one after the other, float32): the input
    x, the normed h1, the rotated q (T, H, hd) and k (T, G, hd), v, the attention's output att (T, H*hd), x2
    after the attention's residual, the normed h2, gate and up (T, hidden), m = silu(gate) * up."""

    x: np.ndarray
    h1: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    att: np.ndarray
    x2: np.ndarray
    h2: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    m: np.ndarray
    seq: int

    def __post_init__(self) -> None:
        tokens = {name: a.shape[0] for name, a in vars(self).items() if name != "seq"}
        if len(set(tokens.values())) != 1 or self.seq < 1 or self.x.shape[0] % self.seq:
            raise ValueError(f"the saved activations' tokens {tokens} are not one forward's sequences of "
                             f"{self.seq}: save one block_forward's")

    @property
    def batch(self) -> TrainShape:
        """The B sequences of `seq` tokens the activations are of."""
        return TrainShape(self.x.shape[0] // self.seq, self.seq)


def block_forward(config, weights, x: np.ndarray) -> tuple[np.ndarray, Saved]:
    """The block's forward (waferrt.model.reference's pieces), every sequence from position 0: x (B, S, dim)
    or (S, dim) -> y of x's shape, and what it saves (the B sequences' S tokens one after the other)."""
    shape, S, hd, heads = x.shape, x.shape[-2], config.head_dim, (config.n_heads, config.n_kv_heads)
    x = x.reshape(-1, x.shape[-1])  # (T = B * S, dim)
    T = x.shape[0]
    cos, sin = rope_cos_sin(np.arange(T) % S, hd, config.rope_theta)  # (T, hd/2)
    h1 = rmsnorm(x, weights.attn_norm, config.norm_eps)
    q, k = (apply_rope(linear(h1, w).reshape(T, n, hd), cos[:, None], sin[:, None])
            for w, n in ((weights.wq, heads[0]), (weights.wk, heads[1])))
    v = linear(h1, weights.wv).reshape(T, heads[1], hd)
    kv = (k.reshape(-1, S, heads[1], hd).transpose(0, 2, 1, 3), v.reshape(-1, S, heads[1], hd).transpose(0, 2, 1, 3))
    att = np.concatenate([causal_attention(q[b * S:(b + 1) * S], kv[0][b], kv[1][b], heads[0] // heads[1], 0)
                          for b in range(T // S)]).reshape(T, -1)  # each sequence on its own
    x2 = x + linear(att, weights.wo)
    h2 = rmsnorm(x2, weights.ffn_norm, config.norm_eps)
    gate, up = linear(h2, weights.w_gate), linear(h2, weights.w_up)
    m = silu(gate) * up
    return (x2 + linear(m, weights.w_down)).reshape(shape), Saved(x, h1, q, k, v, att, x2, h2, gate, up, m, S)


@dataclass(frozen=True)
class BlockShape:
    """What the kernel needs besides the blocks: the block's two RMSNorms and its attention over the tokens."""

    norm: Norm
    prompt: PromptAttention

    @classmethod
    def of(cls, config, batch: TrainShape) -> BlockShape:
        """The block's over the batch's B sequences (attention per sequence: kernels.sequences)."""
        return cls(Norm(config.dim, config.norm_eps),
                   PromptAttention(batch.seq, 1 / np.sqrt(config.head_dim), batch.batch))


def _heads(a: np.ndarray) -> np.ndarray:
    """(rows, cols, H, ...) summed over the heads, booked in the core: (rows, cols, ...)."""
    return a.sum(axis=2)


def block_kernel(ctx, shape: BlockShape, kept: str = "bb.", dy_in: str = "bb.dy", dx_out: str = "bb.d.dx") -> None:
    """The block's backward over the square (module doc): reads the DSM tensors "bb.<input>", the forward's
    activations "<kept><name>" and dy from `dy_in`, stores the gradients as "bb.d.<weight>" and dx in `dx_out`."""
    t = {name: ctx.load(f"bb.{name}")[:, :, 0, 0] for name in INPUTS}
    t |= {name: ctx.load(kept + name)[:, :, 0, 0] for name in ACTIVATIONS} | {"dy": ctx.load(dy_in)[:, :, 0, 0]}
    norm = shape.norm
    # the FFN: down, SwiGLU, gate and up, the second RMSNorm (with the residual's gradient dy)
    dm = relayout(ctx, grad_input(ctx, t["dy"], t["w_down"]), "A", "C")
    dg, du = swiglu_backward(ctx, t["gate"], t["up"], dm)
    dh2 = grad_input(ctx, dg, t["w_gate"]) + grad_input(ctx, du, t["w_up"])
    ctx.compute(dh2[0, 0].size)
    dx2, d_ffn_norm = rmsnorm_backward(ctx, t["x2"], t["ffn_norm"], relayout(ctx, dh2, "A", "C"), t["dy"], norm)
    # the attention: the output projection per head, the attention, RoPE, Q/K/V, the first RMSNorm
    datt = relayout(ctx, grad_input(ctx, dx2[:, :, None], t["wo"]), "A", "C")  # (rows, cols, H, mb, db)
    g = attention_backward(KernelNet(ctx), t["q"], t["k"], t["v"], datt, shape.prompt)
    kv = t["k"].shape[2]
    dk, dv = (relayout(ctx, g[:, :, i, :kv], "B", "C") for i in (1, 2))
    dq, dk = (rope_backward(ctx, d, t["cos"], t["sin"]) for d in (g[:, :, 0], dk))
    parts = [grad_input(ctx, d, t[w]) for d, w in ((dq, "wq"), (dk, "wk"), (dv, "wv"))]
    ctx.compute(sum(p[0, 0].size for p in parts))  # the heads' and the three projections' sums
    dh1 = relayout(ctx, sum(_heads(p) for p in parts), "A", "C")
    dx, d_attn_norm = rmsnorm_backward(ctx, t["x"], t["attn_norm"], dh1, dx2, norm)
    ctx.store(dx_out, dx[:, :, None, None])
    grads = {"attn_norm": d_attn_norm, "ffn_norm": d_ffn_norm,
             "w_down": grad_weight(ctx, t["m"], t["dy"]), "w_gate": grad_weight(ctx, t["h2"], dg),
             "w_up": grad_weight(ctx, t["h2"], du), "wo": grad_weight(ctx, t["att"], dx2[:, :, None]),
             **{w: grad_weight(ctx, t["h1"][:, :, None], d) for w, d in (("wq", dq), ("wk", dk), ("wv", dv))}}
    for name, value in grads.items():
        ctx.store(f"bb.d.{name}", value[:, :, None, None])


def finite_difference(config, weights, x: np.ndarray, dy: np.ndarray, name: str, u: np.ndarray) -> float:
    """The check of a gradient: d/dt of sum(block_forward(params + t u) * dy) at t = 0 by central differences
    in float64, `name` a weight of the block or "x"; equals sum(gradient * u)."""
    def loss(t: float) -> float:
        w = dataclasses.replace(weights, **{n: getattr(weights, n).astype(np.float64) for n in WEIGHTS})
        xs = x.astype(np.float64)
        if name == "x":
            xs = xs + t * u
        else:
            w = dataclasses.replace(w, **{name: getattr(w, name) + t * u})
        return float((block_forward(config, w, xs)[0] * dy).sum())
    return (loss(FD_STEP) - loss(-FD_STEP)) / (2 * FD_STEP)


def _per_head(mat: np.ndarray, heads: int) -> np.ndarray:
    """A projection's (heads * hd, dim) weight as the heads' (dim, hd) B operands: (heads, dim, hd)."""
    return mat.reshape(heads, -1, mat.shape[1]).transpose(0, 2, 1)


def _put(grid: Grid, layout: str, mat: np.ndarray) -> np.ndarray:
    """A matrix's blocks in `layout` over the square (float32)."""
    s = len(grid.rows)
    return scatter(layout, grid, Region(0, 0, s, s), np.ascontiguousarray(mat, np.float32))


def _put_heads(grid: Grid, layout: str, mats) -> np.ndarray:
    """The heads' matrices' blocks in `layout`, the heads after the cores' axes: (s, s, heads, ...)."""
    return np.stack([_put(grid, layout, m) for m in mats], axis=2)


def layer_blocks(config, weights, grid: Grid, batch: TrainShape) -> dict[str, np.ndarray]:
    """A block's weights over the square as its forward's MeshGEMMs take them (the norms' in the C layout,
    the projections in the B layout, Q, K, V and the output projection per head) and RoPE's cos and sin of
    the batch's tokens (every sequence from position 0, in kernels.sequences' order) in the C layout:
    {name: (s, s, ...)}."""
    s, dim, hd, H = len(grid.rows), config.dim, config.head_dim, config.n_heads
    cos, sin = (interleave(a, batch, s) for a in rope_cos_sin(np.arange(batch.tokens) % batch.seq, hd,
                                                                config.rope_theta))
    put, heads = partial(_put, grid), partial(_put_heads, grid)
    return {
        "attn_norm": put("C", np.broadcast_to(weights.attn_norm, (s, dim))),
        "ffn_norm": put("C", np.broadcast_to(weights.ffn_norm, (s, dim))),
        "wq": heads("B", _per_head(weights.wq, H)), "wk": heads("B", _per_head(weights.wk, config.n_kv_heads)),
        "wv": heads("B", _per_head(weights.wv, config.n_kv_heads)), "wo": heads("B", weights.wo.T.reshape(H, hd, dim)),
        "w_gate": put("B", weights.w_gate.T), "w_up": put("B", weights.w_up.T), "w_down": put("B", weights.w_down.T),
        "cos": put("C", np.repeat(cos, 2, axis=1)), "sin": put("C", np.repeat(sin, 2, axis=1)),
    }


def _blocks(config, weights, saved: Saved, dy: np.ndarray, grid: Grid) -> dict[str, np.ndarray]:
    """Every input of the kernel in its layout over the square (module doc): {name: (s, s, ...)}."""
    T, H, hd, batch = dy.shape[0], config.n_heads, config.head_dim, saved.batch
    order = partial(interleave, shape=batch, side=len(grid.rows))  # the tokens in kernels.sequences' order
    put = lambda layout, mat: _put(grid, layout, order(mat))  # noqa: E731
    heads = lambda layout, mat: _put_heads(grid, layout, order(mat).transpose(1, 0, 2))  # noqa: E731
    return {
        **layer_blocks(config, weights, grid, batch),
        "x": put("C", saved.x), "x2": put("C", saved.x2), "dy": put("C", dy), "gate": put("C", saved.gate),
        "up": put("C", saved.up), **{n: heads("C", getattr(saved, n)) for n in ("q", "k", "v")},
        "h1": put("A", saved.h1), "att": heads("A", saved.att.reshape(T, H, hd)),
        "h2": put("A", saved.h2), "m": put("A", saved.m),
    }


def matrices(config, got: dict[str, np.ndarray], grid: Grid, batch: TrainShape) -> dict[str, np.ndarray]:
    """The kernel's outputs read back as the gradients shaped as the weights (out, in) and dx (T, dim) when
    it was read back (from the square's order, kernels.sequences)."""
    dim, hd, hidden = config.dim, config.head_dim, config.hidden_dim
    heads = lambda a, rows, cols: [gather("B", grid, a[:, :, h], rows, cols) for h in range(a.shape[2])]  # noqa: E731
    out = {n: gather("C", grid, got[n], 1, dim)[0] for n in ("attn_norm", "ffn_norm")}
    out |= {n: np.concatenate([g.T for g in heads(got[n], dim, hd)]) for n in ("wq", "wk", "wv")}
    out["wo"] = np.concatenate(heads(got["wo"], hd, dim)).T
    out |= {n: gather("B", grid, got[n], dim, hidden).T for n in ("w_gate", "w_up")}
    out["w_down"] = gather("B", grid, got["w_down"], hidden, dim).T
    if "dx" not in got:
        return out
    s = len(grid.rows)
    return out | {"dx": deinterleave(gather("C", grid, got["dx"], square_tokens(batch, s), dim), batch, s)}


def block_backward(wafer, config, weights, saved: Saved, dy: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """dx (dy's shape: (B, S, dim) or (S, dim), as the forward's x) and the block's weight gradients, keyed as
    ``LayerWeights`` (module doc)."""
    flat = dy.reshape(-1, dy.shape[-1])
    if flat.shape != saved.x.shape:
        raise ValueError(f"dy {dy.shape} is not the gradient of the saved forward's output "
                         f"({saved.x.shape[0] // saved.seq} sequences of {saved.seq} x {saved.x.shape[1]})")
    region, grid = living_square(wafer, "a block's backward")
    blocks = _blocks(config, weights, saved, flat, grid)
    outputs = {f"d.{n}": blocks["x" if n == "dx" else n].shape for n in WEIGHTS + ("dx",)}  # where it is
    job = Job("bb.", region, blocks, outputs, block_kernel, dict(shape=BlockShape.of(config, saved.batch)))
    got = run_job(wafer, job, "a block's backward")
    out = matrices(config, {n[2:]: a for n, a in got.items()}, grid, saved.batch)
    return out.pop("dx").reshape(dy.shape), out
