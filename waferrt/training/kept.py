"""A training step's activations kept on the tiles: each layer's forward leaves on the square what its
backward reads, in the layouts the backward reads them, and the backward reads them there -- no host round trip.

Contract: ``KeptSteps(wafer)`` gives ``forward(x, layer) -> (y, KeptLayer)`` and ``backward(dy, kept, layer) ->
(dx, grads)`` (``mesh.mesh_phases`` puts them at the step's seam). Layer n's activations are the DSM tensors
"kept.<n>.<name>" (x and ``forward.KEPT``: h1, q, k, v, att, x2, h2, gate, up, m; one block a core) on
``onwafer.living_square``, written by ``forward.forward_kernel`` and read by ``block.block_kernel``. What
travels between two layers' kernels stays there too: layer n's forward writes y as "kept.<n+1>.x" (it comes
back as an :class:`OnSquare`, which layer n+1's forward reads in place), layer n's backward writes dx as
"kept.<n-1>.dy". The host puts layer 0's x (the embedding rows streamed in) and the head's dy, and reads the
last layer's y (the head's input: the head's kernel takes it from the host) and layer 0's dx (the
embedding's scatter-add runs off the wafer), besides the weights in and the gradients out; those token-indexed
arrays cross in the square's order (``kernels.sequences.interleave`` / ``deinterleave``: each sequence in
slices, so the attention runs per sequence), the order every tensor kept on the square is already in.
The SRAM plan is ``core.train_memory.keep_plan`` (``plan``), made as layer 0's forward starts a step, which
first frees what a failed attempt left: a layer it does not keep keeps x alone and runs its forward again
from x just before its backward (each books a forward's cycles). A layer's
tensors are freed after its backward. A plan that does not fit even recomputing every layer is
BlockTooLarge as the step starts (naming the core and the bytes); ``held()`` is the bytes a core holds for the
step now, each job's ``Job.held`` (``onwafer.check_fits`` counts it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.mesh import Coord
from waferrt.core.train_cost import TrainShape, square_tokens
from waferrt.core.train_memory import KeepPlan, keep_plan
from waferrt.fabric.misuse import BlockTooLarge
from waferrt.kernels.gemm_backward import gather, scatter
from waferrt.kernels.sequences import deinterleave, interleave

from .block import WEIGHTS, BlockShape, block_kernel, layer_blocks, matrices
from .forward import KEPT, ForwardNames, forward_args, forward_kernel, kept_shapes
from .onwafer import Job, alloc, block_bytes, living_square, run_job

READ_Y, SCRATCH_Y = "bf.o.y", "bf.scratch.y"  # the last layer's y (read back for the head); a recomputed one's


@dataclass(frozen=True)
class OnSquare:
    """A hand-over between two layers' kernels left on the square: layer `layer`'s x or dy, the DSM tensor
    `name`, standing for an array of the host's `shape` (B, S, dim)."""

    layer: int
    name: str
    shape: tuple

    def __post_init__(self) -> None:
        if self.layer < 0 or not self.name.startswith(f"kept.{self.layer}."):
            raise ValueError(f"a hand-over is one of layer {self.layer}'s kept tensors, got {self.name!r}")


@dataclass(frozen=True)
class KeptLayer:
    """What layer `layer`'s forward left for its backward: "kept.<layer>.<name>", all of them or x alone
    (`recompute`); `shape` the batch's (B, S, dim)."""

    layer: int
    recompute: bool
    shape: tuple

    @property
    def prefix(self) -> str:
        return f"kept.{self.layer}."

    @property
    def batch(self) -> TrainShape:
        return _batch(self.shape)


def _batch(shape: tuple) -> TrainShape:
    """The B sequences of S tokens of a host's array (B, S, dim) or (S, dim)."""
    return TrainShape(int(np.prod(shape[:-2])), shape[-2])


class KeptSteps:
    """The mesh phases' forward and backward with the activations kept on the square (module doc)."""

    def __init__(self, wafer):
        self.wafer = wafer
        self.names: dict[str, int] = {}  # the DSM tensors the step keeps -> bytes a core
        self.plan: KeepPlan | None = None
        self.region = self.grid = None

    def held(self) -> int:
        return sum(self.names.values())

    def _free(self, name: str) -> None:
        self.names.pop(name)
        self.wafer.dsm.free(name)

    def _start(self, config, x: np.ndarray) -> int:
        """A step begins: what an earlier attempt left freed, the square and the plan, layer 0's x put."""
        for name in list(self.names):
            self._free(name)
        self.region, self.grid = living_square(self.wafer, "the training step")
        s, batch = len(self.grid.rows), _batch(x.shape)
        self.plan = keep_plan(self.wafer.spec, config, batch, s)
        if not self.plan.fits:
            why = self.plan.overflow(s, str(Coord(self.region.x0, self.region.y0)), self.wafer.spec.name)
            raise BlockTooLarge(f"the training step: {why}; give the wafer a larger square of cores or fewer tokens")
        blocks = self._onto(x, batch)
        alloc(self.wafer, "kept.0.x", blocks.shape, self.region)
        self.names["kept.0.x"] = block_bytes(blocks.shape)
        self.wafer.dsm.put("kept.0.x", blocks)
        return 0

    def _onto(self, a: np.ndarray, batch: TrainShape) -> np.ndarray:
        """A host's token-indexed array (B, S, dim) as the square's blocks, in kernels.sequences' order."""
        s = len(self.grid.rows)
        flat = np.ascontiguousarray(a.reshape(batch.tokens, -1), np.float32)
        return scatter("C", self.grid, self.region, interleave(flat, batch, s))

    def _forward(self, layer, kept: KeptLayer, names: ForwardNames) -> dict:
        """Run layer `kept.layer`'s forward: y read back when it goes to READ_Y (the head's input), else left
        where `names` says with the kept activations."""
        config = layer.config
        inputs = layer_blocks(config, layer.weights, self.grid, kept.batch)
        shapes = kept_shapes(config, inputs)
        leave = {names.kept + n: shapes[n] for n in KEPT} if names.kept else {}
        read = names.y == READ_Y
        leave |= {} if read else {names.y: shapes["x"]}
        job = Job("bf.", self.region, inputs, {"o.y": shapes["x"]} if read else {}, forward_kernel,
                  forward_args(config, kept.batch, names), leave, self.held())
        got = run_job(self.wafer, job, f"layer {kept.layer}'s forward")
        self.names |= {n: block_bytes(shape) for n, shape in leave.items()}
        return got

    def forward(self, x, layer) -> tuple:
        """(y, KeptLayer): y an OnSquare but after the last layer (the host's array for the head)."""
        n = x.layer if isinstance(x, OnSquare) else self._start(layer.config, x)
        kept = KeptLayer(n, self.plan.recomputes(n), tuple(x.shape))
        last = n == layer.config.n_layers - 1
        y = READ_Y if last else f"kept.{n + 1}.x"
        got = self._forward(layer, kept, ForwardNames(kept.prefix + "x", y, "" if kept.recompute else kept.prefix))
        if not last:
            return OnSquare(n + 1, y, kept.shape), kept
        s = len(self.grid.rows)
        y = gather("C", self.grid, got["o.y"], square_tokens(kept.batch, s), layer.config.dim)
        return deinterleave(y, kept.batch, s).reshape(kept.shape), kept

    def _recompute(self, layer, kept: KeptLayer) -> None:
        """A recomputed layer's forward again from its kept x, leaving its activations for its backward."""
        self._forward(layer, kept, ForwardNames(kept.prefix + "x", SCRATCH_Y, kept.prefix))
        self._free(SCRATCH_Y)

    def backward(self, dy, kept: KeptLayer, layer) -> tuple:
        """(dx, {field: grad}): dx an OnSquare but after layer 0 (the host's array); the layer's tensors freed."""
        batch, config, n = kept.batch, layer.config, kept.layer
        if kept.recompute:
            self._recompute(layer, kept)
        inputs = layer_blocks(config, layer.weights, self.grid, batch)
        x = kept_shapes(config, inputs)["x"]
        if not isinstance(dy, OnSquare):  # the head's, from the host
            inputs["dy"] = self._onto(dy, batch)
        outputs = {f"d.{w}": inputs[w].shape for w in WEIGHTS} | ({"d.dx": x} if n == 0 else {})
        dx = "bb.d.dx" if n == 0 else f"kept.{n - 1}.dy"
        leave = {} if n == 0 else {dx: x}
        args = dict(shape=BlockShape.of(config, batch), kept=kept.prefix,
                    dy_in=dy.name if isinstance(dy, OnSquare) else "bb.dy", dx_out=dx)
        got = run_job(self.wafer, Job("bb.", self.region, inputs, outputs, block_kernel, args, leave, self.held()),
                      f"layer {n}'s backward")
        self.names |= {name: block_bytes(shape) for name, shape in leave.items()}
        for name in [name for name in self.names if name.startswith(kept.prefix)]:
            self._free(name)
        grads = matrices(config, {name[2:]: a for name, a in got.items()}, self.grid, batch)
        if n == 0:
            return grads.pop("dx").reshape(kept.shape), grads
        return OnSquare(n - 1, dx, kept.shape), grads
