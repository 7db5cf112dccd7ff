"""Your own mesh kernels: a 2D 5-point stencil and a MeshGEMV over a tiled mesh, checked against numpy.

Run: ``python examples/custom_kernel.py``. It starts Ray in-process and a WSE-2-like mesh of 8x8 cores in
four tile actors (2x2 tiles of 4x4 cores), then runs two kernels written against the kernel context
(``ctx``), each SPMD on every core:

1. **Heat diffusion** on a 64x64 grid, one 8x8 block per core (zero boundary): every step each core
   swaps its edge rows with its N/S neighbours (``ctx.send``: one hop) and its edge columns with its E/W
   neighbours (``ctx.shift``), then updates its block -- the 5-point stencil. The tiles exchange the edges
   that cross tile borders over the fabric themselves; the host only starts the kernel.
2. **MeshGEMV** y = W x with W (64, 96) cut in one block per core and x split over the columns
   (``ctx.gemv``: a local block GEMV, then an allreduce along each row of cores).

Both results are compared with numpy; the modelled cost of each run on a WSE-2 (hops, routing stages, link
bytes, cycles) is printed, and the stencil's run is traced (``with wafer.trace(path):``): open the JSON in
ui.perfetto.dev to see every tile's kernel, primitives, sends and waits, and an arrow from each send to the
wait on the neighbour tile that took it (click a send or a wait to follow it). Exits non-zero if a result is
wrong.
``--local`` runs the same tiles in this process, without Ray: the same results and modelled costs.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

import waferrt

MESH, TILE, BLOCK, STEPS, ALPHA = (8, 8), (4, 4), 8, 10, 0.2


def heat(ctx, steps: int, alpha: float) -> None:
    """`steps` explicit diffusion steps on this tile's blocks of "u" (rows, cols, BLOCK, BLOCK)."""
    u = ctx.load("u")
    for _ in range(steps):
        above = ctx.send(u[:, :, -1, :], 0, 1)  # every core sends its last row south: each gets the row above
        below = ctx.send(u[:, :, 0, :], 0, -1)  # its first row north: each gets the row below
        left = ctx.shift(u[:, :, :, -1], "x", 1)  # its last column east: each gets the column to its left
        right = ctx.shift(u[:, :, :, 0], "x", -1)  # its first column west
        padded = np.zeros(u.shape[:2] + (BLOCK + 2, BLOCK + 2), u.dtype)  # the block with a one-cell halo
        padded[:, :, 1:-1, 1:-1] = u
        padded[:, :, 0, 1:-1], padded[:, :, -1, 1:-1] = above, below
        padded[:, :, 1:-1, 0], padded[:, :, 1:-1, -1] = left, right
        lap = (padded[:, :, :-2, 1:-1] + padded[:, :, 2:, 1:-1] + padded[:, :, 1:-1, :-2] + padded[:, :, 1:-1, 2:]
               - 4 * u)
        u = u + np.float32(alpha) * lap
        ctx.compute(6 * BLOCK * BLOCK)  # the update's flops on each core
    ctx.store("u", u)


def heat_numpy(u: np.ndarray, steps: int, alpha: float) -> np.ndarray:
    for _ in range(steps):
        p = np.pad(u, 1)
        u = u + np.float32(alpha) * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u)
    return u


def gemv(ctx) -> None:
    """y = W x: W's blocks (rows, cols, out_b, in_b), x split over the columns; y comes out split over rows."""
    ctx.store("y", ctx.gemv(ctx.load("W"), ctx.load("x"), "x"))


def report(name: str, good: bool, cost: dict, spec) -> None:
    t = sum(cost.values(), waferrt.Cost())  # the run's primitives one after the other
    print(f"{name}: {'matches numpy' if good else 'WRONG'}; modelled {t.cycles:,.0f} cycles "
          f"({t.seconds(spec) * 1e6:.2f} us on {spec.name}), {t.stages} routing stages, "
          f"{t.link_bytes:,} link bytes ({', '.join(sorted(cost))})")


def main(backend: str = "ray") -> int:
    rng = np.random.default_rng(0)
    u0 = rng.standard_normal((MESH[1] * BLOCK, MESH[0] * BLOCK)).astype(np.float32)
    W = rng.standard_normal((64, 96)).astype(np.float32)
    x = rng.standard_normal(96).astype(np.float32)
    trace = os.path.join(tempfile.mkdtemp(prefix="waferrt-example-"), "stencil-trace.json")
    with waferrt.Wafer(spec="wse2", mesh=MESH, tile=TILE, backend=backend) as wafer:
        print(f"wafer: {wafer.mesh} -> {len(wafer.tiles)} tile actors")
        wafer.dsm.alloc("u", u0.shape)  # split ("y", "x"): one 8x8 block per core
        wafer.dsm.put("u", u0)
        with wafer.trace(trace):
            cost = wafer.run(heat, steps=STEPS, alpha=ALPHA)
        ok_heat = np.allclose(wafer.dsm.get("u"), heat_numpy(u0, STEPS, ALPHA), rtol=1e-4, atol=1e-5)
        report(f"heat, {STEPS} steps", ok_heat, cost, wafer.spec)

        wafer.dsm.alloc("W", W.shape)  # (64, 96): an (8, 12) block per core
        wafer.dsm.alloc("x", x.shape, split=("x",))  # split over the columns, the same down every column
        wafer.dsm.alloc("y", (64,), split=("y",))  # split over the rows, the same along every row
        wafer.dsm.put("W", W)
        wafer.dsm.put("x", x)
        cost = wafer.run(gemv)
        ok_gemv = np.allclose(wafer.dsm.get("y"), W @ x, rtol=1e-4, atol=1e-4)
        report("MeshGEMV 64x96", ok_gemv, cost, wafer.spec)
        print(f"\ntrace of the stencil: {trace} (open it in ui.perfetto.dev)")
        print("\nall runs on this wafer, by primitive:")
        print(wafer.cost())
    return 0 if ok_heat and ok_gemv else 1


if __name__ == "__main__":
    sys.exit(main("local" if "--local" in sys.argv[1:] else "ray"))
