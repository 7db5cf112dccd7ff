"""How the training kernels meet a Wafer: their square of cores, their inputs in its SRAM, one run, the outputs back.

Contract: :func:`living_square` is the first square of side min(width, height) of the wafer's mesh (scanning
from the corner, row by row) with no dead core -- the attention and the head's softmax need every core of
their square; a mesh wider than tall keeps spare squares of the same shape, onto which the training re-plans
after a core dies (the same square's shape: the same float summation order, the same weights bit for bit);
refused (naming the dead) when no such square lives;
:func:`run_job` allocates a :class:`Job`'s inputs and outputs as DSM tensors "<prefix><name>" over the
square (one block per core, split ("y", "x", None, ...)), puts the inputs, checks they fit the cores' SRAM
with the outputs and what the step already keeps there (``Job.held``; BlockTooLarge naming a core and the
bytes), runs the kernel once, reads the outputs back and frees every tensor it made, whatever happens -- but
the ``Job.leave`` tensors, which stay on the square when the kernel succeeds (the activations a forward keeps
for its backward, the hand-over between two layers' kernels: ``training.kept``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from waferrt.core.mesh import Coord, Region
from waferrt.fabric.misuse import BlockTooLarge
from waferrt.kernels.gemm import Grid


def squares(width: int, height: int) -> list[Region]:
    """The squares of side min(width, height) of a width x height mesh, from the corner, row by row."""
    s = min(width, height)
    return [Region(x, y, s, s) for y in range(height - s + 1) for x in range(width - s + 1)]


def living_square(wafer, what: str) -> tuple[Region, Grid]:
    """The first square of the mesh's shortest side with no dead core, and its grid (module doc); ValueError
    naming the dead cores if there is none."""
    dead = wafer.fault_map().cores
    for region in squares(wafer.mesh.width, wafer.mesh.height):
        if not any(region.contains(c) for c in dead):
            return region, Grid.of(region)
    raise ValueError(f"{what} runs on a square of {min(wafer.mesh.width, wafer.mesh.height)} cores a side, whose "
                     f"cores must all live (its softmax needs them); dead: {sorted(dead)}: no such square is left "
                     f"on the {wafer.mesh.width}x{wafer.mesh.height} mesh; give a wider --mesh (spare squares)")


@dataclass(frozen=True)
class Job:
    """One kernel run over a square: its DSM tensors' `prefix`, the inputs' blocks {name: (s, s, ...)}, the
    outputs' shapes, the kernel and its other arguments; `leave` {full DSM name: shape} the tensors it makes
    and leaves on the square, `held` the bytes a core already holds for the step (kept by earlier jobs)."""

    prefix: str
    region: Region
    inputs: dict
    outputs: dict
    kernel: object
    args: dict = field(default_factory=dict)
    leave: dict = field(default_factory=dict)
    held: int = 0

    def __post_init__(self) -> None:
        both = set(self.inputs) & set(self.outputs)
        if both or not self.prefix or self.held < 0:
            raise ValueError(f"a job's inputs and outputs are distinct DSM tensors under a prefix; got "
                             f"prefix {self.prefix!r}, both: {sorted(both)}, held {self.held}")


def check_fits(spec, job: Job, what: str) -> None:
    """BlockTooLarge unless a core holds the job's input and output blocks with what the step keeps."""
    held = sum(a[0, 0].nbytes for a in job.inputs.values())
    made = sum(block_bytes(shape) for shape in (*job.outputs.values(), *job.leave.values()))
    if job.held + held + made > spec.sram_bytes:
        r = job.region
        raise BlockTooLarge(
            f"{what} on {r.w}x{r.h} cores: core {Coord(r.x0, r.y0)} (and every other) would hold {held:,} bytes of "
            f"weights and activations and {made:,} bytes of results on top of {job.held:,} bytes of the layers' "
            f"kept activations, more than its SRAM ({spec.sram_bytes:,} bytes on {spec.name}); give the wafer a "
            "larger square of cores or fewer tokens")


def block_bytes(shape: tuple) -> int:
    """Bytes of one core's block of a float32 tensor of `shape` over the square ((s, s, ...): one block a core)."""
    return 4 * int(np.prod(shape[2:]))


def alloc(wafer, name: str, shape: tuple, region: Region) -> None:
    """A float32 DSM tensor over the square, one block a core."""
    wafer.dsm.alloc(name, shape, region=region, split=("y", "x") + (None,) * (len(shape) - 2))


def run_job(wafer, job: Job, what: str) -> dict[str, np.ndarray]:
    """The job's outputs' blocks {name: (s, s, ...)} (module doc)."""
    check_fits(wafer.spec, job, what)
    shapes = {**{n: a.shape for n, a in job.inputs.items()}, **job.outputs}
    made, left = [], []
    try:
        for name, shape in shapes.items():
            alloc(wafer, job.prefix + name, shape, job.region)
            made.append(job.prefix + name)
        for name, shape in job.leave.items():
            alloc(wafer, name, shape, job.region)
            left.append(name)
        for name, a in job.inputs.items():
            wafer.dsm.put(job.prefix + name, a)
        wafer.run(job.kernel, region=job.region, **job.args)
        left = []  # the kernel ran: they stay
        return {name: wafer.dsm.get(job.prefix + name) for name in job.outputs}
    finally:
        for name in made + left:
            wafer.dsm.free(name)
