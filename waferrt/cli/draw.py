"""A picture of a Placement: mesh coloured by layer; embedding, spare and dead cores; tile and node borders.

Contract: ``draw_png(placement, path, moves=(), title=None)`` writes a PNG and returns its path.
matplotlib is imported inside the function (importing waferrt.scheduler stays light) and through its
object API (no pyplot global state). Moves (from a Replan) are drawn as arrows from old to new region.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from waferrt.core.files import atomic_path
from waferrt.core.mesh import Region, TileId
from waferrt.scheduler.repair import Move
from waferrt.scheduler.report import plan_report
from waferrt.scheduler.types import Placement

FREE, SPARE, DEAD, EMBED = (0.93, 0.93, 0.93), (0.70, 0.88, 0.70), (0.0, 0.0, 0.0), (0.85, 0.35, 0.25)


def _center(r: Region) -> tuple[float, float]:
    return r.x0 + r.w / 2, r.y0 + r.h / 2


def _image(p: Placement, cmap) -> np.ndarray:
    m = p.mesh
    img = np.empty((m.height, m.width, 3))
    img[:] = FREE
    for c in p.spare:
        img[c.y, c.x] = SPARE
    for i, r in enumerate(p.layers):
        img[r.y0:r.y1, r.x0:r.x1] = cmap(i / max(1, len(p.layers) - 1))[:3]
    for e in p.tables():
        img[e.y0:e.y1, e.x0:e.x1] = EMBED
    for c in m.dead:
        img[c.y, c.x] = DEAD
    return img


def _borders(ax, p: Placement) -> None:
    m = p.mesh
    for x in range(m.tile_w, m.width, m.tile_w):
        ax.axvline(x, color="0.35", lw=0.8, ls="--")
    for y in range(m.tile_h, m.height, m.tile_h):
        ax.axhline(y, color="0.35", lw=0.8, ls="--")
    node = dict(p.tile_nodes)
    for t, name in node.items():
        r = m.tile_region(t)
        east, south = node.get(TileId(t.tx + 1, t.ty)), node.get(TileId(t.tx, t.ty + 1))
        if east is not None and east != name:
            ax.plot([r.x1, r.x1], [r.y0, r.y1], color="royalblue", lw=3)
        if south is not None and south != name:
            ax.plot([r.x0, r.x1], [r.y1, r.y1], color="royalblue", lw=3)


def _regions(ax, p: Placement) -> None:
    from matplotlib.patches import Rectangle

    size = max(5.0, min(9.0, 600 / max(p.mesh.width, p.mesh.height) * min(p.layers[0].w, p.layers[0].h) / 4))
    for name, r in p.layer_regions():
        ax.add_patch(Rectangle((r.x0, r.y0), r.w, r.h, fill=False, ec="white", lw=0.6))
        ax.text(*_center(r), name.split(" ")[1], ha="center", va="center", fontsize=size, color="white",
                weight="bold")
    for e, label in zip(p.tables(), ("embed\n+ head",) if p.head is None else ("embed", "head"), strict=True):
        ax.add_patch(Rectangle((e.x0, e.y0), e.w, e.h, fill=False, ec="white", lw=1.2))
        ax.text(*_center(e), label, ha="center", va="center", fontsize=size + 1, color="white", weight="bold")
    path = [_center(r) for r in (p.embed, *p.layers, p.head_region)]
    ax.plot(*zip(*path, strict=True), color="black", lw=0.7, alpha=0.5)
    for a, b in p.dead_links:
        ax.plot([a.x + 0.5, b.x + 0.5], [a.y + 0.5, b.y + 0.5], color="red", lw=2)
    if p.mesh.dead:
        xs, ys = zip(*((c.x + 0.5, c.y + 0.5) for c in p.mesh.dead), strict=True)
        ax.scatter(xs, ys, marker="x", color="red", s=30, lw=1.5, zorder=5)


def draw_png(p: Placement, path: str | Path, moves: Sequence[Move] = (), title: str | None = None) -> Path:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    m, cmap = p.mesh, colormaps["viridis"]
    width = 11.0
    fig = Figure(figsize=(width, max(4.0, width * m.height / m.width * 0.8 + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(_image(p, cmap), extent=(0, m.width, m.height, 0), interpolation="nearest")
    _borders(ax, p)
    _regions(ax, p)
    for mv in {(mv.src, mv.dst) for mv in moves}:
        ax.annotate("", xy=_center(mv[1]), xytext=_center(mv[0]),
                    arrowprops={"arrowstyle": "->", "color": "red", "lw": 1.5})
    fig.colorbar(ScalarMappable(Normalize(0, len(p.layers) - 1), cmap), ax=ax, label="layer", shrink=0.8)
    handles = [Patch(color=EMBED, label="embedding + head"), Patch(color=SPARE, label="spare"),
               Patch(color=FREE, label="free"),
               Line2D([], [], color="red", marker="x", ls="", label="dead core"),
               Line2D([], [], color="0.35", ls="--", label="tile border"),
               Line2D([], [], color="royalblue", lw=3, label="Ray node border")]
    if moves:
        handles.append(Line2D([], [], color="red", label="moved by re-plan"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4, fontsize=8,
              frameon=False)
    r = plan_report(p)
    ax.set_title(title or (
        f"{m}: {len(p.layers)} layers of {r.layer_shape[0]}x{r.layer_shape[1]} cores\n"
        f"SRAM/core max {r.sram_max / 1024:.1f} KB of {r.sram_bytes / 1024:.0f} KB, "
        f"{r.tokens_per_s:,.0f} tok/s modelled"), fontsize=10)
    ax.set_xlabel("x (core column)")
    ax.set_ylabel("y (core row)")
    fig.tight_layout()
    with atomic_path(path) as tmp:  # whole or not at all
        fig.savefig(tmp, dpi=110)
    return Path(path)
