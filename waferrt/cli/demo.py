"""``waferrt demo``: allreduce a tensor over a small mesh of tile actors, check it, print the modelled cost.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` starts a small wafer,
puts a tensor in its DSM, allreduces it along the rows of cores with the chosen algorithm, compares with
numpy and prints the cost per primitive. Exit status 0 when it matches numpy, 1 when not, 2 for a bad mesh
(larger than the spec's wafer, a tile larger than the mesh, more tiles than --max-tiles) or a Ray address
where no cluster answers.
"""

from __future__ import annotations

import argparse
import time

from waferrt.core.cost import ALLREDUCE_ALGOS
from waferrt.core.mesh import Extent
from waferrt.core.spec import PRESETS

from .common import add_max_tiles, checked_mesh, parse_wxh, ray_address


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo", help="allreduce a tensor over a small mesh of tile actors, check it, print the cost",
        description="Start a small wafer (Ray tile actors linked by pyzmq), put a tensor in its "
                    "distributed memory, allreduce it along the rows of cores with the chosen algorithm, "
                    "check the result against numpy and print the modelled cost per primitive.",
        epilog="example: waferrt demo --mesh 8x8 --tile 4x4 --algo ktree --spec tiny")
    p.add_argument("--mesh", type=parse_wxh, default=Extent(8, 8), metavar="WxH",
                   help="cores of the mesh, width x height (default 8x8)")
    p.add_argument("--tile", type=parse_wxh, default=Extent(4, 4), metavar="TWxTH",
                   help="cores per tile actor (default 4x4: an 8x8 mesh is 2x2 tiles)")
    p.add_argument("--spec", choices=sorted(PRESETS), default="tiny",
                   help="hardware spec whose timings the cost model uses (default tiny)")
    p.add_argument("--algo", choices=ALLREDUCE_ALGOS, default="ktree",
                   help="allreduce algorithm (default ktree)")
    add_max_tiles(p)
    p.add_argument("--address", type=ray_address, default=None,
                   help="Ray address to join ('auto' for a local cluster); default: start Ray in-process")
    p.set_defaults(_run=run)
    return p


def run(args) -> int:
    import numpy as np

    from waferrt.runtime import Launch, Wafer

    mesh = checked_mesh(args, lambda size: args.tile)
    w, h = args.mesh.width, args.mesh.height
    shape = (h, 4 * w)  # a block of 1x4 float32 per core
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t0 = time.perf_counter()
    with Wafer(spec=args.spec, mesh=mesh, launch=Launch(args.address, max_tiles=args.max_tiles)) as wafer:
        print(f"wafer: {mesh}, spec {wafer.spec.name}; started in {time.perf_counter() - t0:.1f}s")
        wafer.dsm.alloc("x", shape)
        wafer.dsm.alloc("y", shape)
        wafer.dsm.put("x", x)

        def allreduce_rows(ctx, algo):
            ctx.store("y", ctx.allreduce(ctx.load("x"), "x", algo))

        t1 = time.perf_counter()
        wafer.run(allreduce_rows, algo=args.algo)
        wall = time.perf_counter() - t1
        y = wafer.dsm.get("y")
        ref = np.tile(x.reshape(h, w, 4).sum(axis=1), (1, w))
        ok = np.allclose(y, ref, rtol=1e-4, atol=1e-4)
        print(f"allreduce.{args.algo} along x of a {shape[0]}x{shape[1]} tensor: "
              f"{'matches numpy' if ok else 'DIFFERS FROM numpy'}; emulated in {wall * 1e3:.1f} ms")
        print(wafer.cost())
    return 0 if ok else 1
