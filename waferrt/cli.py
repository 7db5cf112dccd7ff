"""The ``waferrt`` command: one subcommand per job (``waferrt demo``, ``waferrt plan``, ``waferrt generate``).

Contract: :func:`main(argv) -> int` parses the command line and runs one subcommand. ``demo`` lives here;
the others are contributed by the modules in :data:`SUBCOMMAND_MODULES`, each with
``add_parser(subparsers)`` (registers its subparser) and ``run(args) -> int``. Those modules are imported
lazily, only to build ``--help`` or to dispatch, and one that is not installed yet is simply left out;
a real import error inside an existing module is not hidden. Importing this module imports neither Ray
nor pyzmq (``waferrt --help`` is instant).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

# Subcommands contributed by other modules: command name -> module with add_parser(subparsers) and
# run(args) -> int. The module registers the subparser under that same name.
SUBCOMMAND_MODULES = {"plan": "waferrt.cli_plan", "generate": "waferrt.cli_generate"}

DESCRIPTION = """\
waferrt runs an emulated wafer-scale processor: a 2D mesh of small cores, each with its own few tens of
KB of SRAM and links only to its N/E/S/W neighbours, hosted as Ray actors that each own a tile of cores,
and decodes real LLMs on it. Data move only by neighbour hops; every run reports what it would cost on
the modelled wafer (hops, routing stages, link bytes, cycles) next to the wall time it took to emulate."""

EPILOG = """\
examples:
  waferrt generate "The capital of France is"   SmolLM2-135M decoded on an emulated WSE-2 mesh
  waferrt plan --png plan.png                   where every layer of it sits, SRAM per core
  waferrt demo                                  allreduce on an 8x8 mesh in 2x2 tiles of 4x4 cores
  waferrt demo --algo ring --spec wse2          same with the ring algorithm and WSE-2 timings
  waferrt demo --mesh 16x4 --tile 8x2           a non-square mesh (W x H cores, tiles of TW x TH)
  waferrt <command> --help                      options of one command

The mesh is W x H cores (x to the East, y to the South); each tile of TW x TH cores is one Ray actor.
Ray is started in-process unless --address names a running cluster (or "auto" to join the local one)."""


def parse_wxh(text: str) -> tuple[int, int]:
    """'16x8' -> (16, 8): width x height, both positive integers (argparse type)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        w, h = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not WIDTHxHEIGHT: write two positive integers joined by 'x', e.g. 8x8 or 16x4"
        ) from None
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be at least 1, e.g. 8x8")
    return w, h


def _subcommand_modules(argv: list[str]) -> list[object]:
    """The subcommand modules needed to parse `argv`, imported: none for ``demo``, only the named one for
    another known command, all of them otherwise (for --help and for the list of choices in an error).
    A module that is not installed is left out; any other import error propagates."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "demo":
        return []
    names = list(SUBCOMMAND_MODULES.values())
    if command in SUBCOMMAND_MODULES:
        names = [SUBCOMMAND_MODULES[command]]
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return found


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; with `argv`, only the subcommand modules that parsing `argv` needs are imported."""
    parser = argparse.ArgumentParser(prog="waferrt", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"waferrt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    _add_demo(sub)
    for module in _subcommand_modules([] if argv is None else argv):
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def _add_demo(sub) -> None:
    from .spec import PRESETS

    p = sub.add_parser(
        "demo", help="allreduce a tensor over a small mesh of tile actors, check it, print the cost",
        description="Start a small wafer (Ray tile actors linked by pyzmq), put a tensor in its "
                    "distributed memory, allreduce it along the rows of cores with the chosen algorithm, "
                    "check the result against numpy and print the modelled cost per primitive.",
        epilog="example: waferrt demo --mesh 8x8 --tile 4x4 --algo ktree --spec tiny")
    p.add_argument("--mesh", type=parse_wxh, default=(8, 8), metavar="WxH",
                   help="cores of the mesh, width x height (default 8x8)")
    p.add_argument("--tile", type=parse_wxh, default=(4, 4), metavar="TWxTH",
                   help="cores per tile actor (default 4x4: an 8x8 mesh is 2x2 tiles)")
    p.add_argument("--spec", choices=sorted(PRESETS), default="tiny",
                   help="hardware spec whose timings the cost model uses (default tiny)")
    p.add_argument("--algo", choices=("ktree", "ring", "pipeline"), default="ktree",
                   help="allreduce algorithm (default ktree)")
    p.add_argument("--address", default=None,
                   help="Ray address to join ('auto' for a local cluster); default: start Ray in-process")
    p.set_defaults(_run=run_demo)


def run_demo(args) -> int:
    import numpy as np

    from .mesh import MeshSpec
    from .runtime import Wafer

    (w, h), (tw, th) = args.mesh, args.tile
    try:
        mesh = MeshSpec(w, h, tw, th)
    except ValueError as e:
        print(f"waferrt demo: {e}", file=sys.stderr)
        return 2
    shape = (h, 4 * w)  # a block of 1x4 float32 per core
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t0 = time.perf_counter()
    with Wafer(spec=args.spec, mesh=mesh, address=args.address) as wafer:
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("waferrt: interrupted; the wafer was shut down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
