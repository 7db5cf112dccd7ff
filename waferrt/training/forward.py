"""A Llama block's forward on a Wafer, keeping in the cores' SRAM what its backward needs: a training step's
forward on the mesh.

Contract: ``block_forward_mesh(wafer, config, weights, x) -> (y, saved)`` runs one dense Llama block's
forward over x (B, S, dim) or (S, dim) (every sequence from position 0) on ``onwafer.living_square`` and
returns y of x's shape and the :class:`~waferrt.training.block.Saved` activations -- equal to
``block.block_forward``'s (float32, to rounding), and laid out on the square as ``block.block_backward``
takes them. One kernel (:func:`forward_kernel`) runs the decode's block functions (decode.shards.attention_in:
the RMSNorm, the Q, K and V projections, RoPE; attention_residual: the output projection and the residual add;
ffn_residual: the RMSNorm, gate and up, SwiGLU, down, the residual add) on a decode.net.KernelNet -- every
core's block, a sum of squares along the rows, each projection its input skewed into the A layout
(``train_ops.relayout``) and a MeshGEMM per part (Q, K, V and the output projection per head, the output
projection's heads summed in the core; gate, up; down), RoPE's cos and sin blocks each pair's angle on both its
features -- and between them the causal attention (waferrt.kernels.attention on the same KernelNet, per
sequence: the tokens lie on the square in waferrt.kernels.sequences' order, every core row a slice of each
sequence; a K/V head's blocks go with each of its query heads). What the backward reads besides the block
functions' outputs, each projection's A-layout input and gate's and up's outputs, the KernelNet kept
(``KernelNet.kept``). What it books is ``core.train_cost.block_forward_parts`` at
``decode.decoding.ELEMENTWISE_FLOPS`` (tests/unit/test_train_ties.py).
The kernel reads x and writes y and the kept activations under the DSM names a :class:`ForwardNames` gives
(its inputs ``block.layer_blocks``; ``forward_args`` / ``kept_shapes`` the rest of its job):
``block_forward_mesh`` puts x and reads everything back (the host's Saved); ``training.kept`` leaves them on
the square for the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from waferrt.core.train_cost import TrainShape, square_tokens
from waferrt.decode import shards
from waferrt.decode.kernel_net import KernelNet, Parts
from waferrt.kernels.attention import PromptAttention, causal_attention
from waferrt.kernels.gemm_backward import gather, scatter
from waferrt.kernels.sequences import deinterleave, interleave

from .block import BlockShape, Saved, layer_blocks
from .onwafer import Job, living_square, run_job

FORWARD_INPUTS = ("attn_norm", "ffn_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "cos", "sin")
KEPT = ("h1", "q", "k", "v", "att", "x2", "h2", "gate", "up", "m")  # with x, what the backward reads: "<kept><name>"


@dataclass(frozen=True)
class ForwardNames:
    """The DSM tensors of one forward besides its weights ("bf.<input>"): where x is, where y goes, and the
    prefix its kept activations are stored under ("<kept><name>"; "": none kept)."""

    x: str
    y: str
    kept: str = ""

    def __post_init__(self) -> None:
        if not self.x or not self.y or self.x == self.y:
            raise ValueError(f"a forward reads x and writes y in two DSM tensors; got {self}")


def _weights(t: dict[str, np.ndarray]) -> dict[str, object]:
    """The block's weights as the block functions ask for them (decode.shards.On.w), from the kernel's inputs:
    the norms' blocks and each projection's decode.kernel_net.Parts (Q, K and V per head side by side, the
    output projection per head summed, gate and up side by side, down)."""
    one = lambda name: t[name][:, :, None]  # noqa: E731 -- (rows, cols, 1, kb, nb): a part of one head
    return {"attn_norm": t["attn_norm"], "ffn_norm": t["ffn_norm"],
            "wqkv": Parts("wqkv", (t["wq"], t["wk"], t["wv"])), "wo": Parts("wo", (t["wo"],), summed=True),
            "w13": Parts("w13", (one("w_gate"), one("w_up"))), "w2": Parts("w2", (one("w_down"),))}


def forward_kernel(ctx, config, prompt: PromptAttention, names: ForwardNames) -> None:
    """The block's forward over the square (module doc): reads "bf.<input>" and x, stores y and the kept
    activations where `names` says."""
    t = {name: ctx.load(f"bf.{name}")[:, :, 0, 0] for name in FORWARD_INPUTS}
    x = ctx.load(names.x)[:, :, 0, 0]
    net = KernelNet(ctx)
    on = shards.On(net, None, None, config, _weights(t).__getitem__)
    flat = lambda a: a.reshape(*a.shape[:2], 1, -1)  # noqa: E731 -- every core's (mb, db) block as one axis
    sign = np.tile(np.float32([-1, 1]), t["sin"].shape[-1] // 2)  # (-sin, sin) pair by pair: shards.pairwise's
    qkv, qk = shards.attention_in(on, x, shards.Angles(flat(t["cos"]), flat(t["sin"] * sign)))
    heads = lambda a: a.reshape(*a.shape[:3], x.shape[2], -1)  # noqa: E731 -- (rows, cols, heads, mb, db)
    H, G = config.n_heads, config.n_kv_heads
    q, k, v = heads(qk[:, :, :H]), heads(qk[:, :, H:]), heads(qkv[:, :, H + G:])
    att = causal_attention(net, q, np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2), prompt)
    x2 = shards.attention_residual(on, x, att)
    y = shards.ffn_residual(on, x2, partial(shards.dense_ffn, on))
    ctx.store(names.y, y[:, :, None, None])
    kept = net.kept
    gate, up = (kept["w13"].out[:, :, i] for i in (0, 1))
    acts = {"h1": kept["wqkv"].a, "q": q, "k": k, "v": v, "att": kept["wo"].a, "x2": x2, "h2": kept["w13"].a,
            "gate": gate, "up": up, "m": kept["w2"].a}
    for name, value in acts.items() if names.kept else ():
        ctx.store(names.kept + name, value[:, :, None, None])


def forward_args(config, batch: TrainShape, names: ForwardNames) -> dict:
    """The kernel's arguments besides ctx for the batch's B sequences (attention per sequence)."""
    return dict(config=config, prompt=BlockShape.of(config, batch).prompt, names=names)  # the backward's prompt


def kept_shapes(config, inputs: dict) -> dict[str, tuple]:
    """The shapes over the square of x (and y) and of the kept activations (one block a core), from the
    forward's inputs' blocks."""
    s, _, mb, db = inputs["cos"].shape
    x = (s, s, mb, inputs["attn_norm"].shape[-1])
    per = lambda n: (s, s, n, mb, db)  # noqa: E731
    hidden = x[:3] + (inputs["w_gate"].shape[-1],)
    return {"x": x, "h1": x, "x2": x, "h2": x, "q": per(config.n_heads), "k": per(config.n_kv_heads),
            "v": per(config.n_kv_heads), "att": per(config.n_heads), "gate": hidden, "up": hidden, "m": hidden}


def block_forward_mesh(wafer, config, weights, x: np.ndarray) -> tuple[np.ndarray, Saved]:
    """y of x's shape and the saved activations, the forward run on the mesh (module doc)."""
    S, flat = x.shape[-2], x.reshape(-1, x.shape[-1]).astype(np.float32)
    T, hd, H = flat.shape[0], config.head_dim, config.n_heads
    region, grid = living_square(wafer, "a block's forward")
    s, batch = len(grid.rows), TrainShape(T // S, S)
    inputs = layer_blocks(config, weights, grid, batch)
    shapes = kept_shapes(config, inputs)
    outputs = {f"o.{n}": shapes[n] for n in KEPT} | {"o.y": shapes["x"]}
    inputs["o.x"] = scatter("C", grid, region, interleave(flat, batch, s))
    args = forward_args(config, batch, ForwardNames("bf.o.x", "bf.o.y", "bf.o."))
    got = {n[2:]: a for n, a in run_job(wafer, Job("bf.", region, inputs, outputs, forward_kernel, args),
                                        "a block's forward").items()}
    rows = square_tokens(batch, s)
    mat = lambda layout, a, n: deinterleave(gather(layout, grid, a, rows, n), batch, s)  # noqa: E731
    per = lambda layout, a: np.stack([mat(layout, a[:, :, h], hd) for h in range(a.shape[2])], axis=1)  # noqa: E731
    dim, hidden = config.dim, config.hidden_dim
    saved = Saved(x=flat, h1=mat("A", got["h1"], dim), q=per("C", got["q"]), k=per("C", got["k"]),
                  v=per("C", got["v"]), att=per("A", got["att"]).reshape(T, H * hd), x2=mat("C", got["x2"], dim),
                  h2=mat("A", got["h2"], dim), gate=mat("C", got["gate"], hidden), up=mat("C", got["up"], hidden),
                  m=mat("A", got["m"], hidden), seq=S)
    return mat("C", got["y"], dim).reshape(x.shape), saved
