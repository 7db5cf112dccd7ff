"""A training step's work on a grid of cores, composed from the emulator's closed forms: what the on-paper
strategies (estimator.train) charge for a layer's forward and backward, and for the head's.

Contract (pure): :func:`layer_parts` is {op: Cost} of one dense Llama layer's forward and backward over
``run.sequences`` sequences of ``run.seq`` tokens on ``run.side`` x ``run.side`` cores, values moving at
``run.dtype`` and the cores computing at its rate, and :func:`head_parts` the tied head's (its logits, the
cross-entropy, dh, dE, the final RMSNorm's backward) and the embedding's scatter-add. Nothing here is a new
formula -- the owners are the emulator's:

- the forward: ``core.train_cost.block_forward_parts`` (what waferrt.training.forward books on the square);
- the backward: ``core.train_cost.block_backward_parts`` (what waferrt.training.block books), the head's
  ``head_backward_parts`` and the embedding's ``grad_costs`` (what waferrt.training.head books).

Attention runs per sequence, as the kernels run it: the B sequences lie on the square slice by slice
(``core.train_cost.square_tokens``) and their attention is batched with the heads -- no B*S x B*S score block
(tests/unit/test_train_ties.py, with two sequences on two squares).

:func:`pass_cost` puts a pass on a w x h :class:`Grid` of cores: squares of a side that tiles it (min(w, h) / 1,
2, 4, ... -- the fastest whose cores hold a layer's weights and gradients; the left-over cores idle), the sequences
split over them (data parallel), every weight gradient summed over the squares (``core.cost.allreduce_cost``, a ring
of the squares' corresponding cores, ASSUMED as fast as a ring of neighbours) -- a :class:`PassCost`.
:func:`recompute_cost` is what a square adds for the layers whose activations its SRAM does not keep until
their backward: ``core.train_memory.keep_plan``'s recomputed layers over the pass's layers, a forward each
(the activations counted at the run's dtype; the head's bytes at float32, as ``head_core_bytes`` counts
them). Where not even the plan fits a square (a layer's weights and gradients alone overflow its cores) it
charges nothing: the strategies size those by their own ASSUMED halves of the SRAM and micro-batches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, allreduce_cost, cycles_seconds, flop_cycles, total
from waferrt.core.dtypes import check_dtype, itemsize
from waferrt.core.gemm_cost import GemmShape
from waferrt.core.spec import HardwareSpec
from waferrt.core.train_cost import (
    HeadTooLarge,
    TrainShape,
    block_backward_parts,
    block_forward_parts,
    grad_costs,
    head_backward_parts,
    head_chunks,
)
from waferrt.core.train_memory import KeepPlan, keep_plan
from waferrt.decode.decoding import ELEMENTWISE_FLOPS
from waferrt.model.config import LlamaConfig


@dataclass(frozen=True)
class Run:
    """`sequences` sequences of `seq` tokens on a `side` x `side` square, values at `dtype`."""

    sequences: int
    seq: int
    side: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if min(self.sequences, self.seq, self.side) < 1:
            raise ValueError(f"a run needs >= 1 sequence, token and core a side, got {self}")

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq

    @property
    def shape(self) -> TrainShape:
        return TrainShape(self.sequences, self.seq)


def layer_parts(spec: HardwareSpec, config: LlamaConfig, run: Run) -> dict[str, Cost]:
    """{op: Cost} of a layer's forward ("forward.<op>") and backward (block_backward_parts' ops) (module doc)."""
    forward = block_forward_parts(spec, config, run.shape, run.side, ELEMENTWISE_FLOPS, run.dtype)
    backward = block_backward_parts(spec, config, run.shape, run.side, ELEMENTWISE_FLOPS["softmax"], run.dtype)
    return {f"forward.{n}": c for n, c in forward.items()} | backward


def head_parts(spec: HardwareSpec, config: LlamaConfig, run: Run, chunks: int | None = None) -> dict[str, Cost]:
    """The tied head's backward (with its logits' forward) in `chunks` of the vocabulary (default: the fewest
    whose jobs fit a core of `spec` alone, ``head_chunks``, as waferrt.training.head runs it; a pass gives its
    plan's, beside the kept activations), and the embedding's scatter-add."""
    shape = GemmShape(run.tokens, config.vocab_size, config.dim, run.side, run.side)
    return (head_backward_parts(spec, shape, run.dtype, chunks or head_chunks(spec, shape))
            | {"embedding_backward": grad_costs(spec, shape, run.dtype)[1]})


@dataclass(frozen=True)
class PassCost:
    """A pass's kernels on a grid, in cycles of its busiest square: `work` the layers' and the head's (the
    kernels serialise their moves and their flops), `grad_sync` the weight gradients (`grad_bytes` a core)
    summed over the squares; `side` x `side` squares, `squares` of them."""

    work: Cost
    grad_sync: Cost
    grad_bytes: int
    side: int
    squares: int

    @property
    def cycles(self) -> float:
        return self.work.cycles + self.grad_sync.cycles

    def seconds(self, spec: HardwareSpec, dtype: str) -> tuple[float, float]:
        """(compute, fabric) seconds: the flops at `dtype`'s rate, and the rest of the cycles (the moves, the
        gradients' sum)."""
        compute = flop_cycles(spec, self.work.flops, dtype)
        fabric = max(0.0, self.work.cycles - compute) + self.grad_sync.cycles
        return cycles_seconds(spec, compute), cycles_seconds(spec, fabric)


@dataclass(frozen=True)
class Work:
    """What a pass runs: `layers` layers of `config` (and the head if `head`) over `sequences` of `seq`."""

    config: LlamaConfig
    layers: int
    sequences: int
    seq: int
    dtype: str
    head: bool = True

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.layers < 0 or min(self.sequences, self.seq) < 1:
            raise ValueError(f"a pass runs >= 0 layers over >= 1 sequence of >= 1 token, got {self.layers} "
                             f"layers, {self.sequences} sequences of {self.seq}")


@dataclass(frozen=True)
class Grid:
    """The cores a pass runs on: `w` columns by `h` rows."""

    w: int
    h: int


def _sides(spec: HardwareSpec, work: Work, grid: Grid) -> list[int]:
    """The squares' sides a pass may take on the grid: min(w, h) / k for k = 1, 2, 4, ..., a smaller square
    only while its cores hold a copy of a layer's weights and gradients in half their SRAM (ASSUMED: the
    other half for the activations and the streaming buffers)."""
    per_layer = 2 * work.config.layer_params() * itemsize(work.dtype)
    sides, side = [min(grid.w, grid.h)], min(grid.w, grid.h) // 2
    while side >= 1 and per_layer <= spec.sram_bytes / 2 * side * side:
        sides.append(side)
        side //= 2
    return sides


def pass_costs(spec: HardwareSpec, work: Work, grid: Grid) -> list[PassCost]:
    """A pass of `work` on each side of :func:`_sides` whose cores hold the head's jobs, largest side first;
    ``core.train_cost.HeadTooLarge`` when no square's do, even in chunks."""
    costs, refused = [], None
    for s in _sides(spec, work, grid):
        try:
            costs.append(pass_cost(spec, work, grid, s))
        except HeadTooLarge as e:
            refused = e
    if not costs:
        raise refused
    return costs


def pass_cost(spec: HardwareSpec, work: Work, grid: Grid, side: int | None = None) -> PassCost:
    """A pass of `work` on the grid's squares of `side` (default: the fastest of :func:`pass_costs` on the
    grid's own fabric) (module doc)."""
    if side is None:
        return min(pass_costs(spec, work, grid), key=lambda c: c.cycles)
    config, count = work.config, (grid.w // side) * (grid.h // side)
    run = Run(cdiv(work.sequences, count), work.seq, side, work.dtype)
    parts, plan = layer_parts(spec, config, run), pass_plan(spec, work, run)
    head = head_parts(spec, config, run, plan.head_chunks if plan.fits else None) if work.head else {}
    cost = total(parts.values()).scaled(work.layers) + total(head.values()) + recompute_cost(spec, work, run, parts)
    params = work.layers * config.layer_params() + (config.vocab_size * config.dim if work.head else 0)
    grads = cdiv(params, side * side) * itemsize(work.dtype)  # bytes a core holds of the pass's gradients
    sync = allreduce_cost(spec, "ring", count, grads) if count > 1 else Cost()
    return PassCost(cost, sync, grads, side, count)


def recompute_cost(spec: HardwareSpec, work: Work, run: Run, parts: dict[str, Cost]) -> Cost:
    """The forwards a square runs again before their backward: the plan's recomputed layers of the pass's
    (module doc), each a layer's forward over the run (the "forward." ops of its `parts`, ``layer_parts``)."""
    plan = pass_plan(spec, work, run)
    forward = [c for op, c in parts.items() if op.startswith("forward.")]
    return total(forward).scaled(plan.recomputed if plan.fits else 0)


def pass_plan(spec: HardwareSpec, work: Work, run: Run) -> KeepPlan:
    """A square's SRAM plan for the pass's layers (``core.train_memory.keep_plan`` at the run's dtype): which
    layers it recomputes, and the head's chunks beside the kept activations."""
    config = dataclasses.replace(work.config, n_layers=work.layers)
    return keep_plan(spec, config, run.shape, run.side, itemsize(run.dtype))
