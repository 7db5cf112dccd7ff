"""What a training step costs on the modelled wafer: the bytes it streams and its cycles, in closed form.

Contract (the owners of the training facts; each calls the owners below it):
- ``step_stream_bytes(config, shape)`` -> (bytes in, bytes out) of a weight-streaming step: in, the batch's
  embedding rows, every layer twice (forward, backward) and the head once; out, every layer's gradients, the
  head's (table and final norm) and the embedding rows'. Each piece is ``decode.streaming.streamed_bytes``
  (float32: training streams float32 weights and gradients). ``step.train_step`` counts the same bytes as
  they cross (tied in tests/unit/test_training.py).
- ``layer_forward_cycles``, ``layer_backward_cycles`` and ``head_backward_cycles`` are what the mesh kernels
  book for a layer's forward and backward over the batch's B sequences (attention per sequence) and for the
  head (its logits, cross-entropy and their backward) on the region's largest square (``training.mesh``):
  ``core.train_cost.block_forward_parts``, ``block_backward_parts`` and ``head_backward_parts``, summed
  (tests/unit/test_train_mesh.py ties them to a step's ledger).
- The activations each layer's forward keeps for its backward stay in the square's SRAM, all layers' at once;
  the layers that do not fit keep their input alone and run their forward again before their backward
  (``core.train_memory.keep_plan``): ``recompute_cycles`` is what those forwards add to a step (each a
  forward's cycles, in its backward stage; under streaming it may hide under the stage's stream), and the
  head runs in the plan's chunks of the vocabulary.
- ``step_cycles(spec, config, region, shape, streaming)`` -> :class:`StepCycles`. Streaming: every stage lasts
  the longer of its compute and its stream (``decode.streaming.stage_cycles``; a backward stage streams its
  weights in and its gradients out over the one host I/O figure, ``spec.ingress_bytes_per_s``); AdamW runs off
  the wafer, overlapped. Resident: the weights and AdamW's moments stay in SRAM, nothing streams, AdamW runs on
  the region's cores (``core.train_cost.ADAMW_FLOPS`` per weight, ``core.cost.flop_cycles``);
  ``resident_core_bytes`` is what each core then holds (the weights, gradients and two moments, float32).
  The batch is ``core.train_cost.TrainShape``.
"""

from __future__ import annotations

from dataclasses import dataclass

from waferrt.core.arith import cdiv
from waferrt.core.cost import cycles_seconds, flop_cycles, total
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.core.train_cost import (
    ADAMW_FLOPS,
    TrainShape,
    block_backward_parts,
    block_forward_parts,
    head_backward_parts,
)
from waferrt.core.train_memory import KeepPlan, keep_plan
from waferrt.decode.decoding import ELEMENTWISE_FLOPS
from waferrt.decode.stage import StageKind
from waferrt.decode.streaming import stage_cycles, stream_cycles, streamed_bytes
from waferrt.model.config import LlamaConfig


@dataclass(frozen=True)
class StepCycles:
    """A step's modelled cycles: forward, backward (the head's and the recomputed forwards' included),
    optimizer, and in all; `recompute` what the recomputed forwards add to the backward."""

    forward: float
    backward: float
    optimizer: float
    total: float
    recompute: float = 0.0

    def seconds(self, spec: HardwareSpec) -> float:
        return cycles_seconds(spec, self.total)


def step_stream_bytes(config: LlamaConfig, shape: TrainShape) -> tuple[int, int]:
    """(bytes in, bytes out) of a weight-streaming training step (see the module docstring)."""
    layer = streamed_bytes(config, StageKind.LAYER, "float32", 0)
    head = streamed_bytes(config, StageKind.HEAD, "float32", 0)
    rows = streamed_bytes(config, StageKind.EMBED, "float32", shape.tokens)
    return rows + 2 * config.n_layers * layer + head, config.n_layers * layer + head + rows


def layer_forward_cycles(spec: HardwareSpec, config: LlamaConfig, region: Region, shape: TrainShape) -> float:
    """A layer's forward over the batch on the region's largest square, as ``forward.block_forward_mesh``
    books it."""
    side = min(region.w, region.h)
    return total(block_forward_parts(spec, config, shape, side, ELEMENTWISE_FLOPS).values()).cycles


def layer_backward_cycles(spec: HardwareSpec, config: LlamaConfig, region: Region, shape: TrainShape) -> float:
    """A layer's backward over the batch on the region's largest square, as ``block.block_backward`` books it
    (the forward's softmax recomputed)."""
    side = min(region.w, region.h)
    parts = block_backward_parts(spec, config, shape, side, ELEMENTWISE_FLOPS["softmax"])
    return total(parts.values()).cycles


def head_backward_cycles(spec: HardwareSpec, config: LlamaConfig, region: Region, shape: TrainShape) -> float:
    """The head over the batch's tokens -- logits, cross-entropy, their backward, the final norm's -- on the
    region's largest square, as ``head.head_backward`` books it (in the ``keep_plan``'s chunks of the
    vocabulary: the fewest that fit beside the layers' kept activations)."""
    side = min(region.w, region.h)
    head = GemmShape(shape.tokens, config.vocab_size, config.dim, side, side)  # (tokens, vocab, dim)
    chunks = step_plan(spec, config, region, shape).head_chunks
    return total(head_backward_parts(spec, head, chunks=chunks).values()).cycles


def step_plan(spec: HardwareSpec, config: LlamaConfig, region: Region, shape: TrainShape) -> KeepPlan:
    """The step's SRAM plan on the region's largest square (``core.train_memory.keep_plan``)."""
    return keep_plan(spec, config, shape, min(region.w, region.h))


def recompute_cycles(spec: HardwareSpec, config: LlamaConfig, region: Region, shape: TrainShape) -> float:
    """What the recomputed layers' forwards add to a resident step: one forward's cycles each."""
    return step_plan(spec, config, region, shape).recomputed * layer_forward_cycles(spec, config, region, shape)


def step_cycles(spec: HardwareSpec, config: LlamaConfig, region: Region, shape: TrainShape,
                streaming: bool) -> StepCycles:
    """A training step's modelled cycles on `region` (see the module docstring)."""
    fwd = layer_forward_cycles(spec, config, region, shape)
    bwd = layer_backward_cycles(spec, config, region, shape)
    head = head_backward_cycles(spec, config, region, shape)
    redone, layers = step_plan(spec, config, region, shape).recomputed, config.n_layers
    if not streaming:
        opt = flop_cycles(spec, cdiv(ADAMW_FLOPS * config.params(), region.w * region.h))
        redo = recompute_cycles(spec, config, region, shape)
        return StepCycles(layers * fwd, layers * bwd + head + redo, opt, layers * (fwd + bwd) + head + redo + opt,
                          redo)
    layer = streamed_bytes(config, StageKind.LAYER, "float32", 0)
    rows = streamed_bytes(config, StageKind.EMBED, "float32", shape.tokens)
    forward = stream_cycles(spec, rows) + layers * stage_cycles(spec, fwd, layer)
    kept, redo = stage_cycles(spec, bwd, 2 * layer), stage_cycles(spec, fwd + bwd, 2 * layer)  # its weights stream once
    backward = (stage_cycles(spec, head, 2 * streamed_bytes(config, StageKind.HEAD, "float32", 0))
                + (layers - redone) * kept + redone * redo + stream_cycles(spec, rows))
    return StepCycles(forward, backward, 0.0, forward + backward, redone * (redo - kept))


RESIDENT_COPIES = 4  # the weights, their gradients and AdamW's two moments, float32 each


def resident_core_bytes(config: LlamaConfig, region: Region) -> int:
    """Bytes per core of a resident training run's weights, gradients and moments, spread over the region's
    cores (activations not counted)."""
    return cdiv(RESIDENT_COPIES * 4 * config.params(), region.w * region.h)
