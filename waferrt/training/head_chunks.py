"""The tied head's backward in chunks of the vocabulary: its table streamed through the square chunk by chunk.

Contract: ``chunked_head_backward(wafer, config, head, inputs, chunks) -> (loss, dx, grads)`` is
``head.head_backward``'s (the same loss, dx and {"final_norm", "embed"}, exact to float32 rounding) when the
whole table does not fit the square's cores: the vocabulary is cut in `chunks` of cdiv(vocab, chunks) words (the
last padded with zero rows), and three kinds of job run over ``onwafer.living_square`` (each one
``onwafer.run_job``: E's chunk put in the B layout, its targets' one-hot columns in the A layout, h and x in the
C layout): per chunk "hs." folds its logits into an online softmax's running (max, sum of exp, target's logit)
per token (``train_ops.head_stats``); then per chunk "hg." recomputes its logits, adds its share to dh and
writes its rows of dE out as it is done (``train_ops.head_grads``); last "hl." gives the mean loss
(``train_ops.head_loss``) and the final RMSNorm's backward. The running sums and dh cross between jobs through
the host (mb floats a core; the table's chunks come in that way too). What it books:
``core.train_cost.head_backward_parts(spec, shape, chunks=chunks)``; the count ``core.train_cost.head_chunks``.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.kernels import train_ops
from waferrt.kernels.gemm_backward import gather, scatter
from waferrt.kernels.train_ops import HeadShape, Norm

from .onwafer import Job, living_square, run_job


def _load(ctx, prefix: str, names) -> dict:
    return {name: ctx.load(prefix + name)[:, :, 0, 0] for name in names}


def stats_kernel(ctx, vocab: HeadShape) -> None:
    """One chunk folded into the running softmax: reads "hs.h", "hs.embed", "hs.onehot", "hs.run", stores "hs.next"."""
    t = _load(ctx, "hs.", ("h", "embed", "onehot", "run"))
    ctx.store("hs.next", train_ops.head_stats(ctx, t["h"], t["embed"], t["onehot"], t["run"], vocab)[:, :, None, None])


def grads_kernel(ctx, vocab: HeadShape) -> None:
    """One chunk's dh share and dE: reads "hg.h", "hg.embed", "hg.onehot", "hg.run", "hg.dh", stores "hg.dh_out",
    "hg.d.embed"."""
    t = _load(ctx, "hg.", ("h", "embed", "onehot", "run", "dh"))
    dh, de = train_ops.head_grads(ctx, t["h"], t["embed"], t["onehot"], t["run"], vocab)
    ctx.store("hg.dh_out", (t["dh"] + dh)[:, :, None, None])
    ctx.store("hg.d.embed", de[:, :, None, None])


def loss_kernel(ctx, norm: Norm, vocab: HeadShape) -> None:
    """The loss and the final norm's backward: reads "hl.x", "hl.final_norm", "hl.dh", "hl.run", stores "hl.loss",
    "hl.dx", "hl.d.final_norm"."""
    t = _load(ctx, "hl.", ("x", "final_norm", "dh", "run"))
    loss = train_ops.head_loss(ctx, t["run"], vocab)
    dx, dnorm = train_ops.rmsnorm_backward(ctx, t["x"], t["final_norm"], t["dh"], np.zeros_like(t["dh"]), norm)
    for name, value in (("loss", loss), ("dx", dx), ("d.final_norm", dnorm)):
        ctx.store(f"hl.{name}", value[:, :, None, None])


def _chunk(mat: np.ndarray, start: int, words: int, axis: int) -> np.ndarray:
    """Words [start, start + words) of `mat` along `axis`, zero-padded to `words`."""
    part = np.take(mat, np.arange(start, min(start + words, mat.shape[axis])), axis=axis)
    pad = [(0, 0)] * mat.ndim
    pad[axis] = (0, words - part.shape[axis])
    return np.pad(part, pad).astype(np.float32)


def chunked_head_backward(wafer, config, head, inputs: dict, chunks: int):
    """(loss, dx (T, dim), {"final_norm", "embed"}) from inputs {"x", "h" (T, dim), "onehot" (T, vocab)} and
    head {"final_norm" (dim,), "embed" (vocab, dim)} in `chunks` (module doc)."""
    region, grid = living_square(wafer, "the head's backward")
    s, (T, dim), V = region.w, inputs["x"].shape, config.vocab_size
    words = cdiv(V, chunks)
    put = lambda layout, mat: scatter(layout, grid, region, np.ascontiguousarray(mat, np.float32))  # noqa: E731
    h, mb = put("C", inputs["h"]), cdiv(T, s)
    run = np.zeros((s, s, 3, mb), np.float32)
    run[:, :, 0] = -np.inf
    parts = [(put("B", _chunk(head["embed"], c * words, words, 0)), put("A", _chunk(inputs["onehot"], c * words,
              words, 1)), HeadShape(min(words, V - c * words), T)) for c in range(chunks)]
    for embed, onehot, vocab in parts:  # the online softmax, chunk by chunk
        job = Job("hs.", region, {"h": h, "embed": embed, "onehot": onehot, "run": run}, {"next": run.shape},
                  stats_kernel, dict(vocab=vocab))
        run = run_job(wafer, job, "the head's backward (a chunk's softmax)")["next"]
    dh, de = np.zeros_like(h), np.zeros((chunks * words, dim), np.float32)
    for c, (embed, onehot, vocab) in enumerate(parts):  # each chunk's dE written out as it is done
        job = Job("hg.", region, {"h": h, "embed": embed, "onehot": onehot, "run": run, "dh": dh},
                  {"dh_out": dh.shape, "d.embed": embed.shape}, grads_kernel, dict(vocab=vocab))
        got = run_job(wafer, job, "the head's backward (a chunk's gradients)")
        dh, de[c * words:(c + 1) * words] = got["dh_out"], gather("B", grid, got["d.embed"], words, dim)
    norm = put("C", np.broadcast_to(head["final_norm"], (s, dim)))
    job = Job("hl.", region, {"x": put("C", inputs["x"]), "final_norm": norm, "dh": dh, "run": run},
              {"loss": (s, s, 1), "dx": dh.shape, "d.final_norm": norm.shape}, loss_kernel,
              dict(norm=Norm(dim, config.norm_eps), vocab=HeadShape(V, T)))
    got = run_job(wafer, job, "the head's backward (the loss)")
    grads = {"final_norm": gather("C", grid, got["d.final_norm"], 1, dim)[0], "embed": de[:V]}
    return float(got["loss"][0, 0, 0]), gather("C", grid, got["dx"], T, dim), grads
