"""``waferrt sweep``: which wafer design serves a model best -- SRAM per core x mesh x link bandwidth x clock.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` estimates the model on
every design of the grid (``waferrt.scheduler.sweep``), prints the table (or ``--json``), writes the PNG
(``--png``, default sweep.png) and marks the fastest design within the area budget. Exit status: 0 some
design within the budget runs the model, 1 none does, 2 an argument is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys

from waferrt.scheduler.estimate import Objective
from waferrt.scheduler.sweep import AREA_BUDGET_MM2, DEFAULT_GRID, Grid, best_point, sweep, table

from .common import number_list, output_path, parse_wxh
from .estimate import add_workload_args, workload

EPILOG = f"""examples:
  waferrt sweep --model llama3-8b                       the default grid, sweep.png
  waferrt sweep --model smollm2-135m --objective throughput --requests 32 --png smollm2.png
  waferrt sweep --model llama3-8b --strategy layer --sram 32,48,64 --mesh 650x862,750x994 --link 2,4,8
  waferrt sweep --model llama3-8b --strategy grouped:4 --sram 48,64 --json
  waferrt sweep --model codellama-34b --clock 0.9,1.1,1.3 --json

Every design is the --preset spec with its SRAM per core (--sram, KB), mesh (--mesh), link bandwidth
(--link, bytes per cycle) and clock (--clock, GHz) replaced, estimated as `waferrt estimate` does, with
--strategy as `waferrt plan` takes it: layer, tensor, grouped:N (N layers per region), or grouped (the
planner picks N for each design); without it the planner picks any strategy for each design. The
area model (docs/ESTIMATES.md): a core is a WSE-2 core's logic plus its SRAM at TSMC N7 density; the
budget is one WSE-2 die ({AREA_BUDGET_MM2:,.0f} mm2); links and clock are taken to cost no area.
Default grid: SRAM {",".join(str(s // 1024) for s in DEFAULT_GRID.sram_bytes)} KB, meshes
{",".join(f"{w}x{h}" for w, h in DEFAULT_GRID.meshes)}, links 4 B/cycle, clock 1.1 GHz.
"""


def _meshes(text: str) -> tuple[tuple[int, int], ...]:
    return tuple(parse_wxh(m) for m in text.split(","))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep", help="which wafer design (SRAM, mesh, links, clock) serves a model best, table and PNG",
        description="Estimate a model on a grid of wafer designs and mark the fastest within a fixed area budget.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--sram", type=number_list("KB of SRAM per core", 1024, "--sram 32,48,64"),
                   help="SRAM per core, KB, comma-separated (at most 1024)")
    p.add_argument("--mesh", type=_meshes, help="meshes WxH, comma-separated")
    p.add_argument("--link", type=number_list("bytes per cycle", 1024, "--link 2,4,8"),
                   help="link bandwidths, bytes per cycle, comma-separated")
    p.add_argument("--clock", type=number_list("GHz", 10, "--clock 0.9,1.1"), help="clocks, GHz, comma-separated")
    p.add_argument("--png", type=output_path("sweep.png"), default="sweep.png", metavar="PATH",
                   help="where to draw the sweep (sweep.png)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(_run=run)
    return p


def _grid(args) -> Grid:
    d = DEFAULT_GRID
    return Grid(sram_bytes=tuple(int(k * 1024) for k in args.sram) if args.sram else d.sram_bytes,
                meshes=args.mesh or d.meshes,
                link_bytes_per_cycle=args.link or d.link_bytes_per_cycle,
                clock_hz=tuple(c * 1e9 for c in args.clock) if args.clock else d.clock_hz)


def run(args) -> int:
    try:
        config, label, base, tried, kv = workload(args)
        points = sweep(config, base, _grid(args), kv, args.dtype, Objective(args.objective, tried))
    except ValueError as e:
        print(f"waferrt sweep: {e}", file=sys.stderr)
        return 2
    best = best_point(points)
    if args.json:
        print(json.dumps({"model": label, "objective": args.objective, "area_budget_mm2": AREA_BUDGET_MM2,
                          "designs": [p.row() for p in points],
                          "best": best.row() if best else None}, indent=1))
    else:
        what = "one request's tokens/s" if args.objective == "latency" else f"tokens/s with {kv.requests} in flight"
        print(f"{label} on {base.name}-based designs, {args.dtype}, K/V {kv.tokens} x {kv.requests}: {what}")
        print(table(points, best))
        print(f"best within {AREA_BUDGET_MM2:,.0f} mm2: " + (f"{best.design.label()}, {best.tokens_per_s:,.0f} "
              "tokens/s" if best else "no design within the budget runs the model"))
    from waferrt.scheduler.sweep_draw import draw_sweep

    title = f"{label}, {args.dtype}, K/V {kv.tokens}x{kv.requests}: " + (
        "one request's tokens/s" if args.objective == "latency" else f"tokens/s, {kv.requests} in flight")
    path = draw_sweep(points, best, args.png, title)
    print(f"drew {path}", file=sys.stderr if args.json else sys.stdout)
    return 0 if best else 1
