"""The Net inside a kernel over a square of cores: training's forward and the prompt attention's kernel.

Contract: :class:`KernelNet` is the fourth implementation of waferrt.decode.net's interface (see its module
docstring): every core's block of a slab split over the square's rows (tokens) and columns (features) as the
kernel holds it; what each method does it records into the kernel's ledger as it runs, under the op
core.train_cost.block_forward_parts names (:data:`OPS`; inside an outer op, e.g. the attention's, under that).
:class:`Parts` is a weight as its projection takes it, :class:`Projected` what that projection keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.fabric.comm import LineComm
from waferrt.fabric.kernel import Context
from waferrt.kernels.gemm import meshgemm
from waferrt.kernels.sparse_attention import Partial, flash
from waferrt.kernels.train_ops import relayout

from .decoding import ELEMENTWISE_FLOPS as EW

OPS = {"silu_mul": "swiglu"}  # the op KernelNet records element-wise work under, where it is not the work's kind


@dataclass(frozen=True, eq=False)
class Parts:
    """A weight as :class:`KernelNet`'s projection takes it (training's forward): `name`, what its input's
    A-layout copy is kept under (``KernelNet.kept``); `blocks`, its parts' B blocks (MeshGEMM's B layout), each
    (rows, cols, heads, kb, nb) -- parts whose outputs lie side by side (Q, K and V; gate and up), each its own
    MeshGEMM of the one input -- and `summed`: the input holds the heads too (the output projection: each
    head's product, the heads summed in the core)."""

    name: str
    blocks: tuple[np.ndarray, ...]
    summed: bool = False


@dataclass(frozen=True, eq=False)
class Projected:
    """What :class:`KernelNet`'s projection of a weight kept: its input in the A layout (what the weight's
    gradient reads: training.block) and its output in the C layout."""

    a: np.ndarray
    out: np.ndarray


class KernelNet:
    """The implementation inside a kernel over a square of cores (training's forward, waferrt.training.forward;
    the prompt attention's kernel, waferrt.kernels.attention, in the prefill and in training): every core's
    block (rows, cols, tokens, width) of a slab -- tokens over the rows of cores, features over the columns; a
    token's reduction over its features (``norm2``, ``reduce``) is the kernel Context's allreduce along the rows
    of cores (its messages booked as they go), element-wise work every core's block, a projection (``gemv``)
    the input skewed into the A layout (kernels.train_ops.relayout) and a MeshGEMM per part of the weight
    (:class:`Parts`), the A-layout input and the output kept by the weight's name (``kept``: what training's
    backward reads). Each records under its op's name (OPS: what core.train_cost.block_forward_parts lists;
    inside an outer op, e.g. the attention's, under that). Its line arguments are unused: the kernel's
    ``ctx.x`` holds them."""

    fast = False

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.kept: dict[str, Projected] = {}

    def gemv(self, comm: LineComm | None, w: Parts, x: np.ndarray) -> np.ndarray:
        """x (rows, cols, mb, k) in the C layout (or each core's block flattened, (rows, cols, mb * k); with
        ``w.summed`` (rows, cols, heads, mb, k)) times w -> (rows, cols, heads, mb, nb), the parts' heads side
        by side, in the C layout; a lone head's (down; the summed output projection's) as (rows, cols, mb, nb)."""
        ctx = self.ctx
        if not w.summed:
            x = x.reshape(*x.shape[:2], -1, w.blocks[0].shape[-2])[:, :, None]  # (rows, cols, 1, mb, k)
        a = relayout(ctx, x, "C", "A")
        out = np.concatenate([meshgemm(ctx, np.broadcast_to(a, b.shape[:3] + a.shape[3:])[:, :, None], b[:, :, None])
                              for b in w.blocks], axis=2)  # (rows, cols, heads, mb, nb): the input with each head
        if w.summed:
            ctx.compute(out[0, 0].size)  # the heads' sum, in the core
            out = out.sum(axis=2, keepdims=True)
        self.kept[w.name] = Projected(a if w.summed else a[:, :, 0], out)
        return out[:, :, 0] if out.shape[2] == 1 else out

    def norm2(self, comm: LineComm | None, x: np.ndarray) -> np.ndarray:
        """x (rows, cols, tokens, width) -> (rows, cols, tokens): every token's sum of squares, on every core."""
        with self.ctx.ledger.op("rmsnorm"):
            return self.ctx.allreduce((x * x).sum(-1), "x")

    def reduce(self, comm: LineComm | None, a: np.ndarray, op: str, positions: bool = False) -> np.ndarray:
        """a (rows, cols, ..., n): every core's max or sum of its n, then along the rows of cores (the kernel
        Context's allreduce) -> (rows, cols, ..., 1)."""
        return self.ctx.allreduce(a.max(axis=-1) if op == "max" else a.sum(axis=-1), "x", op=op)[..., None]

    def elementwise(self, comm: LineComm | None, kind: str, a: np.ndarray, positions: int = 0) -> None:
        """Record element-wise work of `kind` on every core's block of a (rows, cols, ..., n) (of whose last axis
        a core works `positions`: sparse attention's kept keys)."""
        block = a[0, 0]
        with self.ctx.ledger.op(OPS.get(kind, kind)):
            self.ctx.compute(EW[kind] * (block.size // block.shape[-1] * positions if positions else block.size))

    def flash(self, comm: LineComm | None, s: np.ndarray, kept: np.ndarray) -> Partial:
        """STAR's FlashAttention's statistics on every core's block s (rows, cols, ..., n) of kept scores (the
        prefill's sparse attention, kernels.attention): the running max and sum, no P.V (MeshGEMM multiplies P
        by V, recording it as it moves), nothing recorded (its flops are the softmax's ``elementwise``)."""
        return flash(s, kept)
