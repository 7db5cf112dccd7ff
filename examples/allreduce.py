"""K-tree vs ring allreduce on a 4-tile wafer, checked against numpy, with the modelled cycles of each.

Run: ``python examples/allreduce.py``. It starts Ray in-process, a 16x4 mesh of cores cut into 4 tile
actors of 8x2 cores (2x2 tiles), puts a (4, 16, 64) tensor in the DSM -- one 64-float block per core --
and sums it along each row of 16 cores, first with the K-tree (chains toward each group's first core,
then a multicast back: ~K*n^(1/K) routing stages), then with the ring (reduce-scatter + allgather:
2(n-1) stages). Both results are compared with numpy; the cost model says what each would take on a
WSE-2. Exits non-zero if a result is wrong.
``--local`` runs the same tiles in this process, without Ray: the same results and modelled costs.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import waferrt


def allreduce_rows(ctx, algo: str) -> None:
    """The kernel: every core adds its block to those of all cores in its row (mesh axis x)."""
    ctx.store("sum", ctx.allreduce(ctx.load("x"), "x", algo))


def main(backend: str = "ray") -> int:
    mesh_w, mesh_h, block = 16, 4, 64
    x = np.random.default_rng(0).standard_normal((mesh_h, mesh_w, block)).astype(np.float32)
    expected = np.broadcast_to(x.sum(axis=1, keepdims=True), x.shape)
    ok = True
    with waferrt.Wafer(spec="wse2", mesh=(mesh_w, mesh_h), tile=(8, 2), backend=backend) as wafer:
        print(f"wafer: {wafer.mesh} -> {len(wafer.tiles)} tile actors")
        # one block of 64 floats per core: axis 0 over rows of cores, axis 1 over columns, axis 2 whole
        wafer.dsm.alloc("x", x.shape, split=("y", "x", None))
        wafer.dsm.alloc("sum", x.shape, split=("y", "x", None))
        wafer.dsm.put("x", x)
        for algo in ("ktree", "ring"):
            t0 = time.perf_counter()
            cost = wafer.run(allreduce_rows, algo=algo)[f"allreduce.{algo}"]
            wall = time.perf_counter() - t0
            good = np.allclose(wafer.dsm.get("sum"), expected, rtol=1e-5, atol=1e-4)
            ok &= good
            print(f"{algo:>6}: {'matches numpy' if good else 'WRONG'}; modelled {cost.cycles:.0f} cycles "
                  f"({cost.seconds(wafer.spec) * 1e6:.3f} us on {wafer.spec.name}), {cost.stages} routing "
                  f"stages, {cost.hops} hops; emulated in {wall * 1e3:.1f} ms")
        print("\nall runs on this wafer, by primitive:")
        print(wafer.cost())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main("local" if "--local" in sys.argv[1:] else "ray"))
