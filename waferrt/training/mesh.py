"""The training step's phases on a Wafer: each layer's forward and backward and the head's as the mesh kernels
run them.

Contract: ``mesh_phases(wafer) -> Phases`` is ``step.Phases`` whose ``forward`` is
``forward.block_forward_mesh`` (its Saved activations are what the backward reads), whose ``backward`` is
``block.block_backward`` and whose ``head`` is ``head.head_backward``, each one ``wafer.run`` on the wafer's
largest square of cores (``onwafer.living_square``), booked on the wafer's ledger (``wafer.cost()``); what
they book is ``core.train_cost``'s closed forms (``training.cost.step_cycles`` sums them). The embedding's
gather and scatter-add run off the wafer, where the store keeps the table (as with ``step.REFERENCE``). A
Wafer with ``backend="local"`` runs the kernels in this process (the resident mode, the tests, the streaming
tile). ``PHASES`` names the two choices of ``waferrt train --on``; ``phases_of(name, wafer)`` picks one.
"""

from __future__ import annotations

from waferrt.core.arith import cdiv

from .block import block_backward
from .forward import block_forward_mesh
from .head import head_backward
from .step import REFERENCE, Phases

PHASES = ("mesh", "reference")


class _Top:
    """The head's weights as ``head_backward`` reads them (the final norm and the head's table)."""

    def __init__(self, final_norm, head):
        self.final_norm, self.head = final_norm, head


def mesh_phases(wafer) -> Phases:
    """The phases whose forward, backward and head run as mesh kernels on `wafer` (module doc)."""

    def forward(x, layer, rope):  # x (B, S, dim) -> y (B, S, dim), block.Saved
        return block_forward_mesh(wafer, layer.config, layer.weights, x)

    def backward(dy, saved, layer, rope):  # dy (B, S, dim) -> dx (B, S, dim), {field: grad}
        return block_backward(wafer, layer.config, layer.weights, saved, dy)

    def head(x, final_norm, table, targets, config):  # -> loss, dx (B, S, dim), d final_norm, d table
        loss, dx, grads = head_backward(wafer, config, _Top(final_norm, table), x, targets)
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
