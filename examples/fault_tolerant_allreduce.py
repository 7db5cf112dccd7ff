"""A fault-tolerant allreduce of your own: it routes around a dead core, checked against numpy.

Run: ``python examples/fault_tolerant_allreduce.py``. It starts Ray in-process and a tiny-spec mesh of 8x8
cores in two tile actors (tiles of 8x4 cores), puts one 16-float block per core in the DSM, and injects
``CoreFailure((3, 4), Trigger(step=2))``: core (3, 4) dies as the second kernel command starts.

1. Command 1, the plain allreduce (``ctx.allreduce`` along x, then along y): every core gets the sum of all
   64 blocks -- it matches numpy.
2. Command 2, the same kernel: core (3, 4) is dead and the allreduce needs it. Every tile raises
   ``CoreFailed`` at once, naming the core and the DSM blocks its SRAM held (lost).
3. Command 3, :func:`ft_allreduce`: every tile computes the same spanning tree of the living cores from the
   fault map (``ctx.dead_cores``, ``ctx.link_alive``: breadth first from the first living core), the
   partial sums climb the tree one hop at a time (``ctx.send(..., where=)``: only the cores whose parent
   lies that way send), and the total comes back down the same way. Every living core ends with the sum of
   the 63 living blocks; the dead core's block is lost (``wafer.dsm.get(name, fill=np.nan)`` shows it).

Prints what each command cost on the modelled wafer; exits non-zero if a result is wrong.
``--local`` runs the same tiles in this process, without Ray: the same results and modelled costs.
"""

from __future__ import annotations

import sys
from collections import deque

import numpy as np

import waferrt
from waferrt import Coord
from waferrt.faults import CoreFailed, CoreFailure, Trigger

MESH, TILE, BLOCK, DEAD = (8, 8), (8, 4), 16, Coord(3, 4)
STEPS = ((1, 0), (-1, 0), (0, 1), (0, -1))  # E, W, S, N as (dx, dy)


def allreduce_2d(ctx, src: str, dst: str) -> None:
    """The plain allreduce: along each row of cores, then along each column."""
    ctx.store(dst, ctx.allreduce(ctx.allreduce(ctx.load(src), "x"), "y"))


def spanning_tree(ctx) -> dict[Coord, tuple[int, int]]:
    """Every living core reachable from the first living one over living links: its depth and the index (in
    STEPS) of the step to its parent (-1 for the root). Computed alike on every tile (the same fault map)."""
    live = [c for c in ctx.region.cores() if ctx.alive(c)]
    tree = {live[0]: (0, -1)}
    todo = deque(live[:1])
    while todo:
        c = todo.popleft()
        for k, (dx, dy) in enumerate(STEPS):
            n = Coord(c.x + dx, c.y + dy)
            if ctx.region.contains(n) and ctx.alive(n) and ctx.link_alive(c, n) and n not in tree:
                tree[n] = (tree[c][0] + 1, k ^ 1)  # k ^ 1: the opposite step (E<->W, S<->N)
                todo.append(n)
    return tree


def per_core(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A (rows, cols) mask shaped to pick whole blocks of `like` (rows, cols, *block)."""
    return mask.reshape(mask.shape + (1,) * (like.ndim - 2))


def tree_allreduce(ctx, blocks: np.ndarray) -> np.ndarray:
    """Every core of the tree ends with the sum of the tree's `blocks` (rows, cols, ...), hop by hop."""
    tree = spanning_tree(ctx)
    xs, ys = ctx.coords()
    here = [Coord(int(x), int(y)) for x, y in zip(xs.ravel(), ys.ravel())]
    depth = np.array([tree.get(c, (-1, -1))[0] for c in here]).reshape(ctx.shape)
    up = np.array([tree.get(c, (-1, -1))[1] for c in here]).reshape(ctx.shape)  # the step to the parent
    moves = {(d, k) for d, k in tree.values() if k >= 0}  # (depth, step) pairs some core of the region makes
    top = max(d for d, _ in tree.values())
    acc = np.where(per_core(depth >= 0, blocks), blocks, 0)
    for level in range(top, 0, -1):  # up: the deepest first, each core's partial sum to its parent
        for k, (dx, dy) in enumerate(STEPS):
            if (level, k) in moves:
                acc = acc + ctx.send(acc, dx, dy, where=(depth == level) & (up == k))
    for level in range(1, top + 1):  # down: the total from each parent to its children
        for k, (dx, dy) in enumerate(STEPS):
            if (level, k ^ 1) in moves:  # children at `level` one step k from their parent
                parents = {Coord(c.x - dx, c.y - dy) for c, (d, s) in tree.items() if d == level and s == k ^ 1}
                sends = np.array([c in parents for c in here]).reshape(ctx.shape)
                got = ctx.send(acc, dx, dy, where=sends)
                acc = np.where(per_core((depth == level) & (up == k ^ 1), acc), got, acc)
    return acc


def ft_allreduce(ctx, src: str, dst: str) -> None:
    """The kernel: `src` summed over the living cores into `dst` on each of them (the dead core left out)."""
    ctx.store(dst, tree_allreduce(ctx, ctx.load(src, where=ctx.live)), where=ctx.live)


def main(backend: str = "ray") -> int:
    x = np.random.default_rng(0).standard_normal((MESH[1], MESH[0], BLOCK)).astype(np.float32)
    live = np.ones(x.shape[:2], bool)
    live[DEAD.y, DEAD.x] = False
    ok = True
    with waferrt.Wafer(spec="tiny", mesh=MESH, tile=TILE, backend=backend) as wafer:
        for name in ("x", "s"):
            wafer.dsm.alloc(name, x.shape, split=("y", "x", None))
        wafer.dsm.put("x", x)
        wafer.inject(CoreFailure(DEAD, Trigger(step=2)))  # dies as the second kernel command starts

        cost = wafer.run(allreduce_2d, src="x", dst="s")
        good = np.allclose(wafer.dsm.get("s"), x.sum((0, 1)), atol=1e-4)
        ok &= good
        print(f"plain allreduce, all 64 cores: {'matches numpy' if good else 'WRONG'}; modelled "
              f"{sum(c.cycles for c in cost.values()):.0f} cycles")

        try:
            wafer.run(allreduce_2d, src="x", dst="s")
            print("plain allreduce with a dead core: no error -- WRONG")
            ok = False
        except CoreFailed as e:
            print(f"plain allreduce with a dead core: CoreFailed: {e}")

        cost = wafer.run(ft_allreduce, src="x", dst="s")
        got = wafer.dsm.get("s", fill=np.nan)
        good = np.allclose(got[live], x[live].sum(0), atol=1e-4) and np.isnan(got[~live]).all()
        ok &= good
        print(f"fault-tolerant allreduce around core {DEAD}: {'matches numpy' if good else 'WRONG'} over the "
              f"{live.sum()} living cores; modelled {sum(c.cycles for c in cost.values()):.0f} cycles, "
              f"{cost['send'].messages} messages")
        print(wafer.session.log.table())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main("local" if "--local" in sys.argv[1:] else "ray"))
