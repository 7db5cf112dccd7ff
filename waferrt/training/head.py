"""The tied head with cross-entropy, and the embedding's scatter-add, on a Wafer: a training step's two ends.

Contract: ``head_backward(wafer, config, weights, x, targets) -> (loss, dx, grads)``: x (T, dim) the last
block's output, targets (T,) the next tokens; the loss is the mean softmax cross-entropy of the tied head's
logits rmsnorm(x) E^T, dx its gradient, grads {"final_norm", "embed"} (the head's share of the tied
matrix's gradient). ``embedding_backward(wafer, config, ids, dx) -> dE`` (vocab, dim): the first block's dx
scattered into the embedding rows of the input ids (the embedding's share; a tied model's gradient is the
sum of the two). Both run one kernel over ``onwafer.living_square``: E in the B layout (its gradients land
there), x and the normed h (kept from the forward) in the C layout, the targets' and ids' one-hot rows in the
A layout (waferrt.kernels.train_ops: ``head_backward``, ``rmsnorm_backward``, ``embedding_backward``).
A table too large for the square's SRAM runs in chunks of the vocabulary (waferrt.training.head_chunks).
"""

from __future__ import annotations

import numpy as np

from waferrt.core.gemm_cost import GemmShape
from waferrt.core.train_cost import head_chunks
from waferrt.kernels import train_ops
from waferrt.kernels.gemm_backward import gather, scatter
from waferrt.kernels.train_ops import HeadShape, Norm
from waferrt.model.reference import rmsnorm

from .head_chunks import chunked_head_backward
from .onwafer import Job, living_square, run_job

HEAD_INPUTS = ("x", "h", "final_norm", "embed", "onehot")


def head_kernel(ctx, norm: Norm, vocab: HeadShape) -> None:
    """The head's backward over the square: reads "hb.<input>", stores "hb.loss", "hb.dx", "hb.d.final_norm",
    "hb.d.embed"."""
    t = {name: ctx.load(f"hb.{name}")[:, :, 0, 0] for name in HEAD_INPUTS}
    loss, dh, de = train_ops.head_backward(ctx, t["h"], t["embed"], t["onehot"], vocab)
    dx, dnorm = train_ops.rmsnorm_backward(ctx, t["x"], t["final_norm"], dh, np.zeros_like(dh), norm)
    for name, value in (("loss", loss), ("dx", dx), ("d.final_norm", dnorm), ("d.embed", de)):
        ctx.store(f"hb.{name}", value[:, :, None, None])


def embedding_kernel(ctx) -> None:
    """dE = onehot(ids)^T dX over the square: reads "eb.onehot", "eb.dx", stores "eb.d.embed"."""
    de = train_ops.embedding_backward(ctx, ctx.load("eb.onehot")[:, :, 0, 0], ctx.load("eb.dx")[:, :, 0, 0])
    ctx.store("eb.d.embed", de[:, :, None, None])


def _onehot(tokens: np.ndarray, vocab: int) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0 or tokens.min() < 0 or tokens.max() >= vocab:
        raise ValueError(f"token ids are a non-empty 1-d array of ids below the vocabulary's {vocab}, got "
                         f"shape {tokens.shape}{f' from {tokens.min()} to {tokens.max()}' if tokens.size else ''}")
    onehot = np.zeros((tokens.size, vocab), np.float32)  # (T, vocab), not eye(vocab)'s vocab^2
    onehot[np.arange(tokens.size), tokens] = 1
    return onehot


def head_backward(wafer, config, weights, x: np.ndarray, targets, chunks: int | None = None
                  ) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
    """(loss, dx, {"final_norm", "embed"}) of the tied head's mean cross-entropy (module doc); x (..., dim)
    and targets (...) of any leading shape (B sequences of S: (B, S, dim), (B, S)), dx x's shape. In `chunks`
    of the vocabulary (default: ``core.train_cost.head_chunks``, the fewest whose jobs fit the cores' SRAM;
    more than one: ``head_chunks.chunked_head_backward``)."""
    region, grid = living_square(wafer, "the head's backward")
    shape, x, targets = x.shape, x.reshape(-1, x.shape[-1]), np.ravel(targets)
    s, (T, dim), V = region.w, x.shape, config.vocab_size
    if targets.size != T:
        raise ValueError(f"{targets.size} targets for {T} tokens: give one next token per token of x {shape}")
    h, onehot = rmsnorm(x, weights.final_norm, config.norm_eps), _onehot(targets, V)
    chunks = chunks or head_chunks(wafer.spec, GemmShape(T, V, dim, s, s))
    if chunks > 1:
        loss, dx, grads = chunked_head_backward(wafer, config, {"final_norm": weights.final_norm,
                                                "embed": weights.head}, {"x": x, "h": h, "onehot": onehot}, chunks)
        return loss, dx.reshape(shape), grads
    put = lambda layout, mat: scatter(layout, grid, region, np.ascontiguousarray(mat, np.float32))  # noqa: E731
    inputs = {"x": put("C", x), "h": put("C", h), "final_norm": put("C", np.broadcast_to(weights.final_norm, (s, dim))),
              "embed": put("B", weights.head), "onehot": put("A", onehot)}
    outputs = {"loss": (s, s, 1), "dx": inputs["x"].shape, "d.final_norm": inputs["final_norm"].shape,
               "d.embed": inputs["embed"].shape}
    job = Job("hb.", region, inputs, outputs, head_kernel, dict(norm=Norm(dim, config.norm_eps), vocab=HeadShape(V, T)))
    got = run_job(wafer, job, "the head's backward")
    grads = {"final_norm": gather("C", grid, got["d.final_norm"], 1, dim)[0],
             "embed": gather("B", grid, got["d.embed"], V, dim)}
    return float(got["loss"][0, 0, 0]), gather("C", grid, got["dx"], T, dim).reshape(shape), grads


def embedding_backward(wafer, config, ids, dx: np.ndarray) -> np.ndarray:
    """The embedding's gradient (vocab, dim) from the first block's dx (..., dim) at the input `ids` (...)
    (module doc)."""
    region, grid = living_square(wafer, "the embedding's backward")
    ids, dx = np.ravel(ids), dx.reshape(-1, dx.shape[-1])
    V = config.vocab_size
    inputs = {"onehot": scatter("A", grid, region, _onehot(ids, V)),
              "dx": scatter("C", grid, region, np.ascontiguousarray(dx, np.float32))}
    shape = scatter("B", grid, region, np.zeros((V, dx.shape[1]), np.float32)).shape
    got = run_job(wafer, Job("eb.", region, inputs, {"d.embed": shape}, embedding_kernel), "the embedding's backward")
    return gather("B", grid, got["d.embed"], V, dx.shape[1])
