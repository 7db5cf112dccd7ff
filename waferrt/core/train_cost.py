"""Closed forms of training's mesh kernels: a GEMM's two backward products, a training step's three, attention's,
RMSNorm's, a Llama block's and the tied head's backward.

Contract: for Y = X W (X (m, k), W (k, n)) on a grid of rows x cols cores (s = gcd(rows, cols) steps, mb =
m/rows, kb = k/s, nb = n/cols), the forward is MeshGEMM (``gemm_cost``), and the backward's two products are
MeshGEMM's transposed variant (``transposed_cost``; waferrt.kernels.gemm_backward runs them and books
exactly these, tests/unit/test_gemm_backward.py):

- dX = dY W^T: s steps of a (mb, nb) x (nb, kb) product per core; the (mb, kb) accumulators move along the
  rows after every step, W's (kb, nb) blocks along the columns after all but the last.
- dW = X^T dY: s steps of a (kb, mb) x (mb, nb) product; the (kb, nb) accumulators move along the columns
  (the tokens' sum, reduced over the fabric), X's (mb, kb) blocks along the rows.

On a square grid each backward product thus costs the forward's compute and, per step, one more block move
(the accumulator's) alongside the moving operand's; on a longer ring the partial sums are then summed
around it. :func:`train_gemm_costs` is the three of a training step's GEMM; :func:`train_efficiency` the
share of their modelled time spent on useful flops (the unpadded 2mkn each, spread evenly over the grid).
:func:`attention_backward_cost`, :func:`rmsnorm_backward_cost`, :func:`block_backward_parts` and
:func:`head_backward_parts` (in :func:`head_chunks` chunks of the vocabulary, each job's bytes a core
:func:`head_core_bytes`) are what waferrt.kernels.attention_backward, train_ops and waferrt.training book;
:func:`block_forward_parts` what the block's forward on the mesh (waferrt.training.forward) books.
``ADAMW_FLOPS`` is AdamW's flops per weight (waferrt.training.adamw, counted there by
tests/unit/test_training.py); :class:`TrainShape` is a training step's batch (B sequences of S tokens),
:func:`square_tokens` its rows on a square (each sequence in slices: the block's attention runs per sequence).
Pure: built from waferrt.core.cost's and gemm_cost's owners (a model config is read by its attributes).
"""

from __future__ import annotations

from dataclasses import dataclass

from .arith import cdiv
from .cost import Cost, compute_cost, flop_cycles
from .dtypes import check_dtype, itemsize
from .gemm_cost import (
    AttentionShape,
    GemmShape,
    RingOperand,
    attention_cost,
    gemm_cost,
    probabilities_cost,
    row_reduce_cost,
    skew_cost,
    transposed_cost,
)
from .spec import HardwareSpec

TRAIN_GEMMS = ("forward", "grad_input", "grad_weight")
# flops per element of the backward's element-wise work (the kernels book them, the closed forms count them)
BACKWARD_FLOPS = {
    "softmax": 5,  # per score: P dP and its row sum (2), dP - sum, times P, times the scale (3)
    "rmsnorm": 10,  # x^2 and g x with their sums (4), g = dh w (1), dx (3), dw's product and sum (2)
    "swiglu": 9,  # the sigmoid (3), dgate (4), dup (2)
    "rope": 3,  # as the forward's rotation
    "cross_entropy": 8,  # max, exp, sum, the target's logit, dlogits (softmax - onehot, over T)
}
# AdamW's flops per weight, as waferrt.training.adamw.adamw_update runs them (float32, element-wise): m = b1 m
# + (1-b1) g (3), v = b2 v + (1-b2) g g (4), the bias corrections m/(1-b1^t), v/(1-b2^t) (2), the decay w *=
# 1 - lr wd (1), w -= lr m_hat / (sqrt(v_hat) + eps) (5: sqrt, + eps, lr times, divide, subtract) = 15. The
# norm weights are not decayed (14): the count is the matrices', which hold all but dim * (2 L + 1) weights.
ADAMW_FLOPS = 15


@dataclass(frozen=True)
class TrainShape:
    """A training step's batch: `batch` sequences of `seq` tokens."""

    batch: int
    seq: int

    def __post_init__(self) -> None:
        for name, value in (("batch", self.batch), ("seq", self.seq)):
            if type(value) is not int or value < 1:
                raise ValueError(f"TrainShape.{name} must be a whole number >= 1 (B sequences of S tokens), got "
                                 f"{value!r}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def square_tokens(shape: TrainShape, side: int) -> int:
    """The token rows a side x side square holds of the batch: each sequence cut in `side` slices of
    cdiv(seq, side) tokens (the last zero-padded), core row i holding every sequence's slice i one after
    another (waferrt.kernels.sequences) -- so attention runs per sequence, the sequences batched with the heads."""
    return shape.batch * side * cdiv(shape.seq, side)


def _side(shape: GemmShape) -> int:
    if shape.rows != shape.cols:
        raise ValueError(f"the head's backward runs on a square grid; got {shape.rows} rows x {shape.cols} cols: "
                         "give it a square of cores (waferrt.training.onwafer.living_square)")
    return shape.rows


def grad_costs(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32", rate: str | None = None,
               batch: int = 1) -> tuple[Cost, Cost]:
    """(dX, dW) of Y = X W on a grid of rows x cols cores (module doc), `batch` such products at once (one per
    head, their blocks moving together): values move as `dtype`, the cores compute at `rate`'s (default
    `dtype`)."""
    mb, kb, nb = shape.blocks("meshgemm")
    flops, p, q = 2 * batch * mb * kb * nb, shape.rows, shape.cols
    dx = transposed_cost(spec, RingOperand(q, batch * mb * kb), RingOperand(p, batch * kb * nb), flops, dtype, rate)
    dw = transposed_cost(spec, RingOperand(p, batch * kb * nb), RingOperand(q, batch * mb * kb), flops, dtype, rate)
    return dx, dw


def train_gemm_costs(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32", rate: str | None = None
                     ) -> dict[str, Cost]:
    """A training step's three GEMMs of Y = X W: {"forward", "grad_input", "grad_weight"}."""
    dx, dw = grad_costs(spec, shape, dtype, rate)
    return dict(zip(TRAIN_GEMMS, (gemm_cost(spec, "meshgemm", shape, dtype, 1, rate), dx, dw)))


def train_efficiency(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32") -> dict[str, float]:
    """Useful compute over modelled time of each of the three GEMMs and of the three together ("step"): the
    unpadded product's 2mkn flops (3 x 2mkn) spread evenly over the grid."""
    costs = train_gemm_costs(spec, shape, dtype)
    ideal = flop_cycles(spec, 2 * shape.m * shape.k * shape.n / (shape.rows * shape.cols), dtype)
    return {name: ideal / c.cycles for name, c in costs.items()} | {
        "step": 3 * ideal / sum(c.cycles for c in costs.values())}


def attention_backward_cost(spec: HardwareSpec, shape: AttentionShape, softmax_flops: int, kv_heads: int,
                            dtype: str = "float32", rate: str | None = None) -> Cost:
    """The causal attention's backward (waferrt.kernels.attention_backward) of `shape.heads` query heads
    sharing `kv_heads` K/V heads: K and V skewed, P recomputed, dP = dO V^T (transposed), the row sum, dS,
    dQ = dS K (MeshGEMM, as the forward's P.V), dK and dV (transposed), the query heads' sums."""
    size, side, heads = itemsize(check_dtype(dtype)), shape.side, shape.heads
    rate = check_dtype(rate or dtype)
    mb, db = cdiv(shape.tokens, side), cdiv(shape.head_dim, side)
    dp = transposed_cost(spec, RingOperand(side, heads * mb * mb), RingOperand(side, heads * mb * db),
                         2 * heads * mb * db * mb, dtype, rate)
    dq = gemm_cost(spec, "meshgemm", GemmShape(shape.tokens, shape.tokens, shape.head_dim, side, side), dtype,
                   heads, rate)
    dkv = transposed_cost(spec, RingOperand(side, heads * mb * db), RingOperand(side, heads * mb * mb),
                          2 * heads * mb * mb * db, dtype, rate)
    return (skew_cost(spec, side, heads * mb * db * size).scaled(2)
            + probabilities_cost(spec, shape, softmax_flops, dtype, rate) + dp
            + row_reduce_cost(spec, side, heads * mb, dtype, rate)
            + compute_cost(spec, BACKWARD_FLOPS["softmax"] * heads * mb * mb, rate) + dq + dkv.scaled(2)
            + compute_cost(spec, 2 * (heads // kv_heads - 1) * kv_heads * mb * db, rate))


def rmsnorm_backward_cost(spec: HardwareSpec, tokens: int, dim: int, side: int) -> Cost:
    """RMSNorm's backward over (tokens, dim) in the C layout of side x side cores: two per-token sums along the
    rows, the weight's gradient down the columns, the element-wise work."""
    mb, nb, f32 = cdiv(tokens, side), cdiv(dim, side), "float32"
    return (row_reduce_cost(spec, side, mb, f32, f32).scaled(2) + row_reduce_cost(spec, side, nb, f32, f32)
            + compute_cost(spec, BACKWARD_FLOPS["rmsnorm"] * mb * nb))


def head_backward_parts(spec: HardwareSpec, shape: GemmShape, dtype: str = "float32", chunks: int = 1
                        ) -> dict[str, Cost]:
    """The tied head's backward with cross-entropy (waferrt.training.head) for shape = (tokens, vocab, dim) on a
    square: the logits h E^T (the transposed variant, as a dX), the row max, sum and target's logit along the
    rows and the loss down the columns, dh = dlogits E (MeshGEMM, as a forward), dE = dlogits^T h (as a dW);
    then the final RMSNorm's backward. The GEMMs' values move as `dtype` and compute at its rate (the kernel:
    float32); the softmax's sums and the norm stay float32. In `chunks` > 1 of the vocabulary
    (:func:`head_chunks`), each chunk of cdiv(vocab, chunks) words runs twice: "head_stats" (its logits and the
    three row sums, folded into the online softmax) and, once all are folded, "head_grads" (its logits again,
    dh's share, its dE); "head_loss" sums the loss down the columns once."""
    side = _side(shape)
    if type(chunks) is not int or chunks < 1:
        raise ValueError(f"the head runs in a whole number >= 1 of vocabulary chunks, got {chunks!r}")
    chunk = GemmShape(shape.m, cdiv(shape.k, chunks), shape.n, shape.rows, shape.cols)
    mb, vb, f32 = cdiv(shape.m, side), cdiv(chunk.k, side), "float32"
    gemms = train_gemm_costs(spec, chunk, dtype)
    softmax = compute_cost(spec, BACKWARD_FLOPS["cross_entropy"] * mb * vb)
    reduce, loss = row_reduce_cost(spec, side, mb, f32, f32).scaled(3), row_reduce_cost(spec, side, 1, f32, f32)
    norm = {"rmsnorm_backward": rmsnorm_backward_cost(spec, shape.m, shape.n, side)}
    if chunks == 1:
        return {"head_backward": sum(gemms.values(), Cost()) + reduce + loss + softmax} | norm
    stats = gemms["grad_input"] + reduce + softmax
    grads = sum(gemms.values(), Cost()) + softmax
    return {"head_stats": stats.scaled(chunks), "head_grads": grads.scaled(chunks), "head_loss": loss} | norm


def head_core_bytes(shape: GemmShape, chunks: int) -> int:
    """Bytes a core holds in the head's largest job (waferrt.training.head; float32): unchunked, x, h, the
    norm's weight, E's block, the one-hot's and the outputs (loss, dx, d norm, dE); in chunks, a chunk's
    "head_grads" job (h, E's chunk, its one-hot, the running stats, dh in and out, the chunk's dE), larger
    than its "head_stats" job and the last one (x, the norm's weight, dh, the stats; the loss, dx, d norm)."""
    side = _side(shape)
    mb, nb, vb = cdiv(shape.m, side), cdiv(shape.n, side), cdiv(cdiv(shape.k, chunks), side)
    if chunks == 1:
        return 4 * (3 * mb * nb + 2 * nb + 2 * vb * nb + mb * vb + 1)
    return 4 * (3 * mb * nb + 2 * vb * nb + mb * vb + 3 * mb)


class HeadTooLarge(ValueError):
    """The head's backward does not fit a core's SRAM even in chunks of one word a core."""


def head_chunks(spec: HardwareSpec, shape: GemmShape) -> int:
    """The fewest vocabulary chunks whose head jobs fit a core's SRAM (:func:`head_core_bytes`);
    :class:`HeadTooLarge` naming the bytes when not even one word a core fits. Past one chunk a core's bytes
    never grow with the chunks, so the fewest is found by bisection up to one word a core."""
    last = max(1, cdiv(shape.k, _side(shape)))  # the fewest chunks of one word a core: fewer bytes cannot be had
    if head_core_bytes(shape, 1) <= spec.sram_bytes:
        return 1
    if last > 1 and head_core_bytes(shape, last) <= spec.sram_bytes:
        lo, hi = 2, last
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if head_core_bytes(shape, mid) <= spec.sram_bytes else (mid + 1, hi)
        return lo
    raise HeadTooLarge(f"the head's backward over {shape.m} tokens and dim {shape.n} on {shape.rows}x{shape.cols} "
                     f"cores needs {head_core_bytes(shape, last):,} bytes a core even one word a core, more than "
                     f"{spec.sram_bytes:,} on {spec.name}: give fewer tokens or a larger square")


def block_backward_parts(spec: HardwareSpec, config, shape: TrainShape, side: int, softmax_flops: int,
                         dtype: str = "float32") -> dict[str, Cost]:
    """What a dense Llama block's backward (waferrt.training.block) books over the batch `shape` on side x side
    cores (its :func:`square_tokens` rows; the attention per sequence, the forward's softmax at `softmax_flops`
    a score, recomputed), by op: the GEMMs' dX and dW (the
    projections per head; Q, K, V's dW with the normed input shared by the heads), the layout moves, the
    element-wise ops, the attention, the sums in the cores ("compute"). Values move as `dtype` and the cores
    compute at its rate (the kernel: float32, the default); the RMSNorms stay float32."""
    H, G, hd, dim, hidden = config.n_heads, config.n_kv_heads, config.head_dim, config.dim, config.hidden_dim
    tokens, B = square_tokens(shape, side), shape.batch
    mb, nb, hb, db = (cdiv(v, side) for v in (tokens, dim, hidden, hd))
    size = itemsize(check_dtype(dtype))
    gemms = [(GemmShape(tokens, hidden, dim, side, side), 1)] + [(GemmShape(tokens, dim, hidden, side, side), 1)] * 2
    gemms += [(GemmShape(tokens, hd, dim, side, side), H)]  # the output projection, per head
    heads = [(GemmShape(tokens, dim, hd, side, side), n) for n in (H, G, G)]  # Q, K, V per head
    grads = [grad_costs(spec, shape, dtype, None, n) for shape, n in gemms + heads]
    qkv_dw = [transposed_cost(spec, RingOperand(side, n * nb * db), RingOperand(side, mb * nb), 2 * n * mb * nb * db,
                              dtype) for n in (H, G, G)]  # the normed input moves once for all the heads
    moved = [mb * hb, mb * nb, H * mb * db, G * mb * db, G * mb * db, mb * nb]
    norm = rmsnorm_backward_cost(spec, tokens, dim, side)
    return {
        "grad_input": sum((dx for dx, _ in grads), Cost()),
        "grad_weight": sum((dw for _, dw in grads[:4]), Cost()) + sum(qkv_dw, Cost()),
        "relayout": sum((skew_cost(spec, side, n * size) for n in moved), Cost()),
        "swiglu_backward": compute_cost(spec, BACKWARD_FLOPS["swiglu"] * mb * hb, dtype),
        "rmsnorm_backward": norm.scaled(2),
        "rope_backward": sum((compute_cost(spec, BACKWARD_FLOPS["rope"] * n * mb * db, dtype) for n in (H, G)),
                             Cost()),
        "attention_backward": attention_backward_cost(spec, AttentionShape(shape.seq, hd, B * H, side), softmax_flops,
                                                      B * G, dtype),
        "compute": compute_cost(spec, mb * nb, dtype) + compute_cost(spec, (H + 2 * G) * mb * nb, dtype),
    }


def block_forward_parts(spec: HardwareSpec, config, shape: TrainShape, side: int, flops: dict,
                        dtype: str = "float32") -> dict[str, Cost]:
    """What a dense Llama block's forward on the mesh (waferrt.training.forward) books over the batch `shape` on
    side x side cores (its :func:`square_tokens` rows; the attention per sequence), by op, `flops` the
    element-wise flops per element (decode.decoding.ELEMENTWISE_FLOPS: "rmsnorm", "rope", "softmax", "silu_mul",
    "residual"): the two RMSNorms (a sum of squares along the rows), the
    projections by MeshGEMM (Q, K, V and the output per head, gate, up, down), the activations into the A
    layout (skews), RoPE, the causal attention, SwiGLU, the residual adds, the heads' sum ("compute")."""
    H, G, hd, dim, hidden = config.n_heads, config.n_kv_heads, config.head_dim, config.dim, config.hidden_dim
    tokens = square_tokens(shape, side)
    mb, nb, hb, db = (cdiv(v, side) for v in (tokens, dim, hidden, hd))
    size, f32 = itemsize(check_dtype(dtype)), "float32"
    shapes = [(GemmShape(tokens, dim, hd, side, side), n) for n in (H, G, G)]  # Q, K, V per head
    shapes += [(GemmShape(tokens, hd, dim, side, side), H)] + [(GemmShape(tokens, dim, hidden, side, side), 1)] * 2
    shapes += [(GemmShape(tokens, hidden, dim, side, side), 1)]
    norm = row_reduce_cost(spec, side, mb, f32, f32) + compute_cost(spec, flops["rmsnorm"] * mb * nb)
    return {
        "rmsnorm": norm.scaled(2),
        "relayout": sum((skew_cost(spec, side, n * size) for n in (mb * nb, H * mb * db, mb * nb, mb * hb)), Cost()),
        "meshgemm": sum((gemm_cost(spec, "meshgemm", shape, dtype, n) for shape, n in shapes), Cost()),
        "rope": compute_cost(spec, flops["rope"] * (H + G) * mb * db, dtype),
        "attention": attention_cost(spec, AttentionShape(shape.seq, hd, shape.batch * H, side), flops["softmax"],
                                    dtype),
        "swiglu": compute_cost(spec, flops["silu_mul"] * mb * hb, dtype),
        "residual": compute_cost(spec, flops["residual"] * mb * nb, dtype).scaled(2),
        "compute": compute_cost(spec, H * mb * nb, dtype),
    }
