"""A Llama block's forward on a Wafer, keeping in the cores' SRAM what its backward needs: a training step's
forward on the mesh.

Contract: ``block_forward_mesh(wafer, config, weights, x) -> (y, saved)`` runs one dense Llama block's
forward over x (B, S, dim) or (S, dim) (every sequence from position 0) on ``onwafer.living_square`` and
returns y of x's shape and the :class:`~waferrt.training.block.Saved` activations -- equal to
``block.block_forward``'s (float32, to rounding), and laid out on the square as ``block.block_backward``
takes them. One kernel (:func:`forward_kernel`) runs every op on the mesh: the RMSNorms (the decode's block
function decode.shards.mesh_rmsnorm on a decode.net.KernelNet: a sum of squares along the rows), each
projection a MeshGEMM (waferrt.kernels.gemm: Q, K, V and the output projection per head, gate, up, down; their
input skewed into the A layout first, ``train_ops.relayout``), RoPE in the cores (its cos and sin blocks, each
pair's angle on both its features), the causal attention (waferrt.kernels.attention, per sequence: the tokens
lie on the square in waferrt.kernels.sequences' order, every core row a slice of each sequence; a K/V head's
blocks go with each of its query heads), SwiGLU and the residual adds in the cores (decode.shards.rope,
swiglu, residual, on the KernelNet too), the output projection's heads summed in the core. What it books is
``core.train_cost.block_forward_parts`` at
``decode.cost.ELEMENTWISE_FLOPS`` (tests/unit/test_train_ties.py).
The kernel reads x and writes y and the kept activations under the DSM names a :class:`ForwardNames` gives
(its inputs ``block.layer_blocks``; ``forward_args`` / ``kept_shapes`` the rest of its job):
``block_forward_mesh`` puts x and reads everything back (the host's Saved); ``training.kept`` leaves them on
the square for the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.train_cost import TrainShape, square_tokens
from waferrt.decode import shards
from waferrt.decode.net import KernelNet
from waferrt.kernels.attention import PromptAttention, causal_attention
from waferrt.kernels.gemm import meshgemm
from waferrt.kernels.gemm_backward import gather, scatter
from waferrt.kernels.sequences import deinterleave, interleave
from waferrt.kernels.train_ops import Norm, relayout

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


def _rmsnorm(ctx, x: np.ndarray, w: np.ndarray, norm: Norm) -> np.ndarray:
    """x / rms(x) * w over (rows, cols, mb, nb) blocks in the C layout: the decode's RMSNorm block function
    (decode.shards.mesh_rmsnorm) on the kernel's KernelNet, the sum of squares along the rows of cores."""
    with ctx.ledger.op("rmsnorm"):
        return shards.mesh_rmsnorm(KernelNet(ctx), None, x, w, norm).astype(np.float32, copy=False)


def _elementwise(ctx, name: str, flops: int, out: np.ndarray) -> np.ndarray:
    """`out`, booking `flops` per element of one core's block under `name`."""
    with ctx.ledger.op(name):
        ctx.compute(flops * out[0, 0].size)
    return out


def _heads(ctx, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a (A layout, (rows, cols, mb, kb)) times each head's w (B layout, (rows, cols, heads, kb, db)) by
    MeshGEMM, a's block moving with each head's: (rows, cols, heads, mb, db) in the C layout."""
    return meshgemm(ctx, np.broadcast_to(a[:, :, None], w.shape[:3] + a.shape[2:])[:, :, None], w[:, :, None])


def forward_kernel(ctx, norm: Norm, prompt: PromptAttention, names: ForwardNames) -> None:
    """The block's forward over the square (module doc): reads "bf.<input>" and x, stores y and the kept
    activations where `names` says."""
    t = {name: ctx.load(f"bf.{name}")[:, :, 0, 0] for name in FORWARD_INPUTS}
    x = ctx.load(names.x)[:, :, 0, 0]
    h1 = _rmsnorm(ctx, x, t["attn_norm"], norm)
    h1a = relayout(ctx, h1, "C", "A")
    q, k, v = (_heads(ctx, h1a, t[w]) for w in ("wq", "wk", "wv"))  # (rows, cols, heads, mb, db)
    net = KernelNet(ctx)  # the block functions' element-wise work on every core's block
    sign = np.tile(np.float32([-1, 1]), t["sin"].shape[-1] // 2)  # (-sin, sin) pair by pair: shards.pairwise's
    angles = shards.Angles(t["cos"][:, :, None], (t["sin"] * sign)[:, :, None])  # (rows, cols, 1, mb, db)
    with ctx.ledger.op("rope"):
        q, k = (shards.rope(net, None, a, angles) for a in (q, k))
    rep = q.shape[2] // k.shape[2]
    att = causal_attention(ctx, q, np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2), prompt)
    atta = relayout(ctx, att, "C", "A")
    o = meshgemm(ctx, atta[:, :, None], t["wo"][:, :, None])  # (rows, cols, H, mb, nb)
    o = _elementwise(ctx, "compute", 1, o).sum(axis=2)  # the heads' sum, in the core
    with ctx.ledger.op("residual"):
        x2 = shards.residual(net, None, x, o)
    h2 = _rmsnorm(ctx, x2, t["ffn_norm"], norm)
    h2a = relayout(ctx, h2, "C", "A")
    gate, up = (meshgemm(ctx, h2a[:, :, None], t[w][:, :, None]) for w in ("w_gate", "w_up"))
    with ctx.ledger.op("swiglu"):
        m = shards.swiglu(net, None, gate, up)
    ma = relayout(ctx, m, "C", "A")
    down = meshgemm(ctx, ma[:, :, None], t["w_down"][:, :, None])
    with ctx.ledger.op("residual"):
        y = shards.residual(net, None, x2, down)
    ctx.store(names.y, y[:, :, None, None])
    kept = {"h1": h1a, "q": q, "k": k, "v": v, "att": atta, "x2": x2, "h2": h2a, "gate": gate, "up": up, "m": ma}
    for name, value in kept.items() if names.kept else ():
        ctx.store(names.kept + name, value[:, :, None, None])


def forward_args(config, batch: TrainShape, names: ForwardNames) -> dict:
    """The kernel's arguments besides ctx for the batch's B sequences (attention per sequence)."""
    shape = BlockShape.of(config, batch)  # the same norms and attention as the backward's block
    return dict(norm=shape.norm, prompt=shape.prompt, names=names)


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
