"""A training step as the wafer runs it under weight streaming: one function per layer phase, every streamed
byte counted.

Contract: ``train_step(store, tokens, step, phases, epoch) -> StepReport`` runs optimizer step `step` (1, 2, ...)
on the rows tokens (B, S+1): the embedding rows of the inputs stream in, then each layer's weights (the
forward, ``phases.forward``, keeping its activations on the wafer), the head (``phases.head``: the final norm,
the logits, the loss and their backward), each layer's weights again from the last to the first
(``phases.backward``), and each layer's gradients stream out as soon as they are whole, to be applied by
AdamW off the wafer; the final norm's, the head's and the embedding rows' gradients go last. Every payload
goes out with its CRC (``faults.payload_crc``), which the store checks. `store` is
anything with ParamStore's ``rows/layer/head/push_layer/push_top`` (the in-process ParamStore: the resident
mode; a client of the MemoryX actor: weight streaming on Ray). StepReport's bytes_in / bytes_out are the
nbytes of every array that crossed, counted as they cross (``cost.step_stream_bytes`` is their closed form).

:class:`Phases` is the seam to the wafer's kernels: ``REFERENCE`` (the numpy reference's ``model.backward``
functions) or ``mesh.mesh_phases(wafer)`` (a layer's backward and the head's as mesh kernels on a Wafer), with
the same arguments and results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from waferrt.model import backward
from waferrt.model.reference import Layer, Rope

from .faults import payload_crc
from .store import Push, TopGrads


@dataclass(frozen=True)
class Phases:
    """forward(x, layer, rope) -> (y, saved); backward(dy, saved, layer, rope) -> (dx, {field: grad});
    head(x, final_norm, head, targets, config) -> (loss, dx, d final_norm, d head)."""

    forward: Callable
    backward: Callable
    head: Callable


REFERENCE = Phases(forward=backward.block_forward, backward=backward.block_backward, head=backward.head_loss)


@dataclass(frozen=True)
class StepReport:
    """A step's loss (mean cross-entropy before the update) and the bytes it streamed in and out."""

    loss: float
    bytes_in: int
    bytes_out: int

    def __post_init__(self) -> None:
        if not np.isfinite(self.loss):
            raise FloatingPointError(f"the training loss is {self.loss}: the step diverged; lower the learning "
                                     "rate")


def _nbytes(x) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, tuple):
        return sum(_nbytes(v) for v in x)
    return sum(_nbytes(v) for v in x.arrays().values())  # a LayerWeights


def train_step(store, tokens: np.ndarray, step: int, phases: Phases = REFERENCE, epoch: int = 0) -> StepReport:
    """One optimizer step on tokens (B, S+1), attempt `epoch` of it; see the module docstring."""
    config = store.config
    inputs, targets = backward.split_tokens(config, tokens)
    rope = Rope.at(np.arange(inputs.shape[1]), config)  # cos, sin (S, hd//2)
    x = store.rows(inputs)  # (B, S, dim)
    seen_in, seen_out, saved = [x.nbytes], [], []
    for i in range(config.n_layers):
        lw = store.layer(i)
        seen_in.append(_nbytes(lw))
        x, s = phases.forward(x, Layer(lw, config), rope)
        saved.append(s)
    top = store.head()
    seen_in.append(_nbytes(top))
    loss, dx, dnorm, dhead = phases.head(x, *top, targets, config)
    for i in reversed(range(config.n_layers)):
        lw = store.layer(i)
        seen_in.append(_nbytes(lw))
        dx, grads = phases.backward(dx, saved.pop(), Layer(lw, config), rope)
        store.push_layer(i, grads, Push(step, payload_crc(grads), epoch))
        seen_out.append(_nbytes(grads))
    out = TopGrads(dnorm, dhead, dx, inputs)
    store.push_top(out, Push(step, payload_crc(out.arrays()), epoch))
    seen_out.append(dnorm.nbytes + dhead.nbytes + dx.nbytes)
    return StepReport(loss, sum(seen_in), sum(seen_out))
