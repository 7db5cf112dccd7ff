"""``waferrt sweep --train``: the training co-exploration over the wafer template, its table and its PNG.

Contract: ``run_train_sweep(args) -> int`` reads sweep's --train arguments (--dies, --sram, --flops, --d2d,
--topology over the --template base, default wse2's per-core figures), runs
``waferrt.estimator.train_sweep.train_sweep``, prints the table (or --json) with the best design per strategy
and draws the PNG (--png). Exit status: 0 some design trains the model, 1 none does, 2 an argument is wrong.
"""

from __future__ import annotations

import json
import sys

from waferrt.estimator.train_sweep import TrainGrid, best_per_strategy, train_sweep, train_table

from .common import UsageError
from .train_estimate import train_job


def _grid(args) -> TrainGrid:
    d = TrainGrid()
    return TrainGrid(dies=args.dies or d.dies,
                     sram_bytes=tuple(int(k * 1024) for k in args.sram) if args.sram else d.sram_bytes,
                     half_flops_per_cycle=args.flops or d.half_flops_per_cycle,
                     d2d_bytes_per_s=tuple(b * 1e12 for b in args.d2d) if args.d2d else d.d2d_bytes_per_s,
                     topologies=args.topology or d.topologies)


def run_train_sweep(args) -> int:
    try:
        job, base = train_job(args, "sweep", ("--link", "--clock"))
        points = train_sweep(job, base, _grid(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    best = best_per_strategy(points)
    head = (f"{job.label} training, {job.shape.batch} x {job.shape.seq} tokens per step, {job.dtype}, on "
            f"{base.name}-based designs within one WSE-2's area: tokens/s per strategy")
    if args.json:
        print(json.dumps({"model": job.label, "global_batch": job.shape.batch, "seq": job.shape.seq,
                          "designs": [p.row() for p in points],
                          "best": {s: b.row() if b else None for s, b in best.items()}}, indent=1))
    else:
        print(head)
        print(train_table(points, best))
        for s, b in best.items():
            print(f"best for {s}: " + (f"{b.design.label()}, {b.tokens_per_s(s):,.0f} tokens/s" if b else "none fits"))
    from .train_draw import draw_train_sweep

    path = draw_train_sweep(points, best, args.png, f"{job.label}, {job.shape.batch}x{job.shape.seq} tokens per step")
    print(f"drew {path}", file=sys.stderr if args.json else sys.stdout)
    return 0 if any(best.values()) else 1
