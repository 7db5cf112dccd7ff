"""A picture of a training sweep: one panel per strategy, every design's tokens/s, the best one starred.

Contract: ``draw_train_sweep(points, best, path, title)`` writes a PNG and returns its path: x = SRAM per core
(KB, log scale; designs side by side by die count and topology), y = tokens/s; colour = topology, marker =
die count; designs that do not fit sit on the dotted floor; each panel's best design is a star with its
label. matplotlib through its object API, imported inside the function (as waferrt/cli/sweep_draw.py).
"""

from __future__ import annotations

from pathlib import Path

from waferrt.core.files import atomic_path
from waferrt.core.topology import TOPOLOGIES
from waferrt.estimator.sweep import sram_kb
from waferrt.estimator.train import STRATEGIES
from waferrt.estimator.train_sweep import TrainPoint

from .sweep_draw import sram_axes

COLOURS = dict(zip(TOPOLOGIES, ("tab:blue", "tab:orange", "tab:green"), strict=True))
MARKERS = ("o", "s", "^", "D", "v", "P")


def draw_train_sweep(points: list[TrainPoint], best: dict, path, title: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    dies = sorted({p.design.dies for p in points}, key=lambda d: d[0] * d[1])

    def x_of(d) -> float:  # side by side: die count, then topology
        return d.sram_bytes / 1024 * (1 + 0.035 * (3 * dies.index(d.dies) + TOPOLOGIES.index(d.topology.kind)))

    marker = {d: MARKERS[i % len(MARKERS)] for i, d in enumerate(dies)}
    fig = Figure(figsize=(16, 5.4))
    FigureCanvasAgg(fig)
    top = max((p.tokens_per_s(s) for p in points for s in STRATEGIES), default=1.0) or 1.0
    floor = top * 0.01
    for k, strategy in enumerate(STRATEGIES):
        ax = fig.add_subplot(1, len(STRATEGIES), k + 1)
        for p in points:
            d = p.design
            ax.scatter([x_of(d)], [p.tokens_per_s(strategy) or floor], marker=marker[d.dies],
                       s=22 + 6 * d.half_flops_per_cycle, color=COLOURS[d.topology.kind], alpha=0.7)
        b = best.get(strategy)
        if b is not None:
            bx, by = x_of(b.design), b.tokens_per_s(strategy)
            ax.scatter([bx], [by], s=420, marker="*", color="crimson", zorder=4)
            ax.annotate(f"best: {b.design.label()}\n{by:,.0f} tokens/s", (bx, by), xytext=(0.03, 0.97),
                        textcoords="axes fraction", va="top", fontsize=8, color="crimson",
                        arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 0.8})
        sram_axes(ax, sorted({sram_kb(p.design.sram_bytes) for p in points}), top * 1.35, floor)
        ax.set_title(strategy, fontsize=10)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], ls="", marker="o", color=c, label=t) for t, c in COLOURS.items()]
    handles += [Line2D([], [], ls="", marker=marker[d], color="0.3", label=f"{d[0]}x{d[1]} dies") for d in dies]
    handles += [Line2D([], [], ls="", marker="*", color="crimson", markersize=14, label="best per strategy")]
    fig.legend(handles=handles, loc="center right", fontsize=8.5, frameon=False)
    fig.suptitle(title + " (marker size: flops per core; dotted: does not fit)", fontsize=11)
    fig.subplots_adjust(left=0.05, right=0.88, bottom=0.11, top=0.86, wspace=0.25)
    path = Path(path)
    with atomic_path(path) as tmp:  # whole or not at all
        fig.savefig(tmp, dpi=110)
    return path
