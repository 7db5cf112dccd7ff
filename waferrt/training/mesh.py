"""The training step's phases on a Wafer: each layer's forward and backward and the head's as the mesh kernels
run them.

Contract: ``mesh_phases(wafer) -> Phases`` is ``step.Phases`` whose ``forward`` and ``backward`` are
``kept.KeptSteps``' (``forward.forward_kernel`` and ``block.block_kernel``, the activations the forward keeps
staying on the tiles for the backward, or recomputed there: ``core.train_memory.keep_plan``) and whose
``head`` is ``head.head_backward`` (in the plan's chunks of the vocabulary), each one ``wafer.run`` on the wafer's
largest square of cores (``onwafer.living_square``), booked on the wafer's ledger (``wafer.cost()``); what
they book is ``core.train_cost``'s closed forms (``training.cost.step_cycles`` sums them). The embedding's
gather and scatter-add run off the wafer, where the store keeps the table (as with ``step.REFERENCE``). A
Wafer with ``backend="local"`` runs the kernels in this process (the resident mode, the tests, the streaming
tile). ``PHASES`` names the two choices of ``waferrt train --on``; ``phases_of(name, wafer)`` picks one.
"""

from __future__ import annotations

from waferrt.core.arith import cdiv

from .head import head_backward
from .kept import KeptSteps
from .step import REFERENCE, Phases

PHASES = ("mesh", "reference")


class _Top:
    """The head's weights as ``head_backward`` reads them (the final norm and the head's table)."""

    def __init__(self, final_norm, head):
        self.final_norm, self.head = final_norm, head


def mesh_phases(wafer) -> Phases:
    """The phases whose forward, backward and head run as mesh kernels on `wafer` (module doc)."""

    steps = KeptSteps(wafer)

    def forward(x, layer, rope):  # x (B, S, dim) or kept.OnSquare -> y (the same), kept.KeptLayer
        return steps.forward(x, layer)

    def backward(dy, kept, layer, rope):  # dy (B, S, dim) or kept.OnSquare -> dx (the same), {field: grad}
        return steps.backward(dy, kept, layer)

    def head(x, final_norm, table, targets, config):  # -> loss, dx (B, S, dim), d final_norm, d table
        # the fewest chunks that fit beside the layers' kept activations (no plan: a forward of another's)
        chunks = None if steps.plan is None else steps.plan.head_chunks
        loss, dx, grads = head_backward(wafer, config, _Top(final_norm, table), x, targets, chunks)
        return loss, dx, grads["final_norm"], grads["embed"]

    return Phases(forward=forward, backward=backward, head=head)


def phases_of(name: str, wafer=None) -> Phases:
    """``REFERENCE`` for "reference"; ``mesh_phases(wafer)`` for "mesh"."""
    if name not in PHASES:
        raise ValueError(f"a training step runs on one of {PHASES}, got {name!r}")
    if name == "reference":
        return REFERENCE
    if wafer is None:
        raise ValueError("the mesh phases run on a Wafer: give one (Wafer(..., backend='local'))")
    return mesh_phases(wafer)


def even_rope_blocks(config, region) -> bool:
    """Whether the region's largest square leaves each core an even head_dim block (RoPE's pairs whole)."""
    return cdiv(config.head_dim, min(region.w, region.h)) % 2 == 0


def mesh_side(config, region) -> int:
    """The largest square side within `region` whose cores' head_dim blocks keep RoPE's pairs whole."""
    return next(s for s in range(min(region.w, region.h), 0, -1) if cdiv(config.head_dim, s) % 2 == 0)
