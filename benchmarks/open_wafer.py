"""Opening a Wafer on a shared Ray: new tile actors against kept ones (waferrt.actors.pool), side by side.

One Ray for the whole run (as a notebook or a test session has it). Each round opens a Wafer of `--tiles`
tile actors with tiles not kept (WAFERRT_KEEP_TILES=0: every tile a new Ray worker process), runs one
allreduce on it and closes it; then the same with tiles kept (the first such Wafer starts them, the next ones
take them). Prints, per mode, the median (min-max) over the rounds of the open's wall seconds and of the CPU
seconds the whole machine spent from open to close (/proc/stat: the workers' start-up is in other
processes), and the ratios; the allreduce's result is checked equal in every round.

    python benchmarks/open_wafer.py [--tiles 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from waferrt.actors.pool import KEEP_ENV, POOL
from waferrt.actors.session import ray_init, ray_shutdown
from waferrt.core.mesh import MeshSpec
from waferrt.runtime import Wafer


def busy_seconds() -> float:
    """CPU seconds the machine has been busy (user, nice, system, irq, softirq, steal), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def one_round(tiles: int) -> tuple[float, float]:
    """Open a Wafer of `tiles` 2x2-core tiles in a row, allreduce along it, close: (open wall s, CPU s)."""
    cpu0, t0 = busy_seconds(), time.perf_counter()
    with Wafer(mesh=MeshSpec(2 * tiles, 2, 2, 2)) as w:
        opened = time.perf_counter() - t0
        w.dsm.alloc("x", (2, 2 * tiles, 1), split=("y", "x", None))
        w.dsm.put("x", np.ones((2, 2 * tiles, 1), np.float32))
        w.run(lambda ctx: ctx.store("x", ctx.allreduce(ctx.load("x"), "x")))
        if not (w.dsm.get("x") == 2 * tiles).all():
            raise AssertionError("the allreduce along the row of tiles gave a wrong sum")
    return opened, busy_seconds() - cpu0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", type=int, default=8, help="tile actors a Wafer has (8)")
    ap.add_argument("--rounds", type=int, default=3, help="Wafers opened per mode (3)")
    args = ap.parse_args()
    if args.tiles < 1 or args.rounds < 1:
        ap.error("--tiles and --rounds are whole numbers >= 1")
    started = ray_init(None)
    try:
        got = {}
        for mode, keep in (("new actors", "0"), ("kept tiles", str(args.tiles))):
            os.environ[KEEP_ENV] = keep
            if keep != "0":
                one_round(args.tiles)  # the first Wafer starts the tiles it leaves for the next
            got[mode] = [one_round(args.tiles) for _ in range(args.rounds)]
        POOL.drain()
    finally:
        if started:
            ray_shutdown()
    print(f"opening a Wafer of {args.tiles} tile actors on a shared Ray, {args.rounds} rounds each "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    print(f"{'':12} {'open (wall s)':>22} {'open to close (CPU s)':>24}")
    for mode, rounds in got.items():
        print(f"{mode:12} {spread([o for o, _ in rounds]):>22} {spread([c for _, c in rounds]):>24}")
    new, kept = got["new actors"], got["kept tiles"]
    ratio = statistics.median(o for o, _ in new) / statistics.median(o for o, _ in kept)
    cpu = statistics.median(c for _, c in new) / statistics.median(c for _, c in kept)
    print(f"kept tiles open {ratio:.0f}x faster and cost {cpu:.1f}x less CPU")


if __name__ == "__main__":
    main()
