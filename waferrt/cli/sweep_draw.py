"""A picture of a design-space sweep: tokens/s against SRAM per core, one line per mesh, what bounds it.

Contract: ``draw_sweep(points, best, path, title)`` writes a PNG and returns its path: one panel per (link
bandwidth, clock) pair, x = SRAM per core (KB, log scale), y = tokens/s; a line per mesh size; the marker
says what bounds the design (compute, fabric, ingress; a cross at the bottom: does not fit in SRAM);
designs over the area budget are hollow; the best design within the budget is a star. matplotlib is
imported inside the function, through its object API (no pyplot global state), as waferrt/cli/draw.py does.
"""

from __future__ import annotations

from pathlib import Path

from waferrt.core.files import atomic_path
from waferrt.estimator.sweep import AREA_BUDGET_MM2, Point, sram_kb

MARKERS = {"compute": "o", "fabric": "^", "ingress": "s", "SRAM capacity": "X"}


def sram_axes(ax, kbs: list[float], ymax: float, floor: float) -> None:
    """x: SRAM per core in KB (log 2, a tick at each of `kbs`), y: tokens/s up to `ymax`, a dotted line at
    `floor` (where the designs that do not fit are drawn)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(kbs)
    ax.set_xticklabels([str(kb) for kb in kbs])
    ax.minorticks_off()
    ax.set_ylim(0, ymax)
    ax.axhline(floor, color="0.6", lw=0.8, ls=":")
    ax.set_xlabel("SRAM per core (KB)")
    ax.set_ylabel("tokens/s")


def draw_sweep(points: list[Point], best: Point | None, path, title: str) -> Path:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    panels = sorted({(p.design.link_bytes_per_cycle, p.design.clock_hz) for p in points})
    meshes = sorted({p.design.mesh for p in points}, key=lambda m: m[0] * m[1])
    colors = {m: colormaps["viridis"](i / max(1, len(meshes) - 1) * 0.85) for i, m in enumerate(meshes)}
    fig = Figure(figsize=(5.5 * len(panels) + 3.6, 5.2))
    FigureCanvasAgg(fig)
    top = max((p.tokens_per_s for p in points), default=1.0) or 1.0
    floor = top * 0.02  # where a design that does not fit is drawn
    for k, (link, clock) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for m in meshes:
            pts = sorted((p for p in points if p.design.mesh == m and (p.design.link_bytes_per_cycle, p.design.clock_hz)
                          == (link, clock)), key=lambda p: p.design.sram_bytes)
            xs = [p.design.sram_bytes / 1024 for p in pts]
            ys = [p.tokens_per_s or floor for p in pts]
            ax.plot(xs, ys, color=colors[m], lw=1.5, alpha=0.6)
            for p, x, y in zip(pts, xs, ys):
                ax.scatter([x], [y], s=70, marker=MARKERS[p.estimate.bound], zorder=3, linewidths=1.5,
                           facecolors=colors[m] if p.within_budget else "none", edgecolors=colors[m])
            if best is not None and best in pts:
                ax.scatter([best.design.sram_bytes / 1024], [best.tokens_per_s], s=420, marker="*", color="crimson",
                           zorder=4, label="best within budget")
                ax.annotate(f"best: {best.design.label()}\n{best.tokens_per_s:,.0f} tokens/s",
                            (best.design.sram_bytes / 1024, best.tokens_per_s), xytext=(0.03, 0.97),
                            textcoords="axes fraction", va="top", fontsize=8.5, color="crimson",
                            arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 0.8})
        sram_axes(ax, sorted({sram_kb(p.design.sram_bytes) for p in points}), top * 1.3, floor)
        ax.set_title(f"links {link:g} B/cycle, clock {clock / 1e9:g} GHz", fontsize=10)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[m], lw=2, label=f"mesh {m[0]}x{m[1]}") for m in meshes]
    handles += [Line2D([], [], ls="", marker=mk, color="0.3", markersize=8, label=f"bound: {b}")
                for b, mk in MARKERS.items()]
    handles += [Line2D([], [], ls="", marker="o", markerfacecolor="none", color="0.3", markersize=8,
                       label=f"over the area budget\n({AREA_BUDGET_MM2:,.0f} mm2)"),
                Line2D([], [], ls="", marker="*", color="crimson", markersize=14, label="best within the budget")]
    right = 1 - 3.0 / fig.get_figwidth()
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(right + 0.01, 0.5), fontsize=8.5, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.subplots_adjust(left=0.08 / len(panels) + 0.02, right=right, bottom=0.11, top=0.86, wspace=0.25)
    path = Path(path)
    with atomic_path(path) as tmp:  # whole or not at all
        fig.savefig(tmp, dpi=110)
    return path
