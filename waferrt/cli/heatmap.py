"""A heatmap of the mesh: SRAM booked per core, link traffic per core, busy time per tile; dead and spare cores.

Contract: ``heatmap_png(placement, path, measured=None)`` writes a PNG of three panels over the mesh and
returns its path; :class:`Measured` is what a decode that ran adds (its runs, busy seconds, bytes sent,
wall time). What each panel shows, and where it comes from:

- **SRAM booked per core**, as a share of the core's SRAM: what every stage books
  (waferrt.decode.setup.stage_sram -- the bookings the tiles make); spare cores (kept for repair) are
  outlined in green, dead cores crossed in red.
- **Link traffic per core (modelled)**: each stage region's link bytes from the decode's closed forms
  (waferrt.decode.cost: its allreduces, the K/V shift, the hand-over of the activations into it -- what
  the tiles book), spread evenly over the region's cores (the closed forms count a region's bytes, not
  each link's). With ``runs`` (the StageRuns of a decode that ran) they are the bytes of every token
  that ran, at its position; without, of one token with a full K/V reserve. ``sent`` (bytes each tile
  sent over each link, measured: waferrt.serving.trace.DecodeTrace.sent_bytes) is drawn as arrows
  between the tiles, labelled with the bytes that really crossed the fabric.
- **Busy per tile**: with ``busy`` (seconds each tile spent computing, measured) the share of the decode's
  wall time ``wall_s``; without, each tile's modelled cycles per token (its stages, one token alone) as a
  share of the busiest tile's -- the pipeline's bottleneck.

matplotlib through its object API, imported inside the function (as cli.draw does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from waferrt.core.files import atomic_path
from waferrt.core.mesh import Dir, MeshSpec, TileId
from waferrt.decode.cost import alone_cycles, token_cost
from waferrt.decode.decoding import Decoding, Routing
from waferrt.decode.schedule import StageRun
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.decode.stage import entries
from waferrt.scheduler.types import Placement

SPARE = (0.2, 0.75, 0.2, 0.6)  # RGBA of a spare core
LABEL = {"fontsize": 8, "ha": "center", "va": "center",
         "bbox": {"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8}}


def sram_share(p: Placement) -> np.ndarray:
    """(height, width): bytes booked on every core, as a share of its SRAM."""
    setup = DecodeSetup.from_placement(p)
    img = np.zeros((p.mesh.height, p.mesh.width))
    for s in range(len(setup.stages())):
        for region, nbytes in stage_sram(setup, s).values():
            img[region.y0:region.y1, region.x0:region.x1] += nbytes
    return img / p.spec.sram_bytes


def link_bytes(p: Placement, runs: Sequence[StageRun] | None = None) -> np.ndarray:
    """(height, width): modelled link bytes per core -- each stage region's bytes spread over its cores."""
    setup = DecodeSetup.from_placement(p)
    stages = setup.stages()
    if runs is None:  # one token, a full K/V
        tokens = {s: [(setup.kv_tokens - 1, True)] for s in range(len(stages))}
    else:
        tokens = {}
        for r in runs:
            tokens.setdefault(r.stage, []).extend((it.pos, it.want) for it in r.items)
    img = np.zeros((p.mesh.height, p.mesh.width))
    into = entries(stages)
    for s, items in tokens.items():
        nbytes = sum(token_cost(p.spec, _priced(setup), into[s], pos, want).link_bytes for pos, want in items)
        region = into[s].region
        img[region.y0:region.y1, region.x0:region.x1] += nbytes / region.size
    return img


def _priced(setup: DecodeSetup) -> Decoding:
    """The run's closed forms with an MoE's experts at their expected routing (as the estimator prices them)."""
    return replace(setup.decoding, routing=Routing.EXPECTED)


def modelled_busy(p: Placement) -> dict[TileId, float]:
    """Each tile's share of the busiest tile's modelled cycles per token (its stages, one token alone)."""
    setup = DecodeSetup.from_placement(p)
    stages, tiles = setup.stages(), setup.stage_tiles()
    cycles = dict.fromkeys(p.mesh.tiles(), 0.0)
    for s, entry in enumerate(entries(stages)):
        cycles[tiles[s]] += alone_cycles(p.spec, _priced(setup), entry, setup.kv_tokens - 1, True)
    top = max(cycles.values()) or 1.0
    return {t: c / top for t, c in cycles.items()}


def _tile_image(mesh: MeshSpec, values: dict[TileId, float]) -> np.ndarray:
    img = np.full((mesh.height, mesh.width), np.nan)
    for t, v in values.items():
        r = mesh.tile_region(t)
        img[r.y0:r.y1, r.x0:r.x1] = v
    return img


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _outline(ax, p: Placement, spare: bool = False) -> None:
    """Tile borders, region outlines, dead cores (and spare cores) on one panel."""
    from matplotlib.patches import Rectangle

    m = p.mesh
    for x in range(m.tile_w, m.width, m.tile_w):
        ax.axvline(x, color="0.25", lw=0.8, ls="--")
    for y in range(m.tile_h, m.height, m.tile_h):
        ax.axhline(y, color="0.25", lw=0.8, ls="--")
    for r in (*p.tables(), *p.layers):
        ax.add_patch(Rectangle((r.x0, r.y0), r.w, r.h, fill=False, ec="white", lw=0.5))
    if spare and p.spare:
        img = np.zeros((m.height, m.width, 4))
        for c in p.spare:
            img[c.y, c.x] = SPARE
        ax.imshow(img, extent=(0, m.width, m.height, 0), interpolation="nearest")
    if m.dead:
        xs, ys = zip(*((c.x + 0.5, c.y + 0.5) for c in m.dead), strict=True)
        ax.scatter(xs, ys, marker="x", color="red", s=28, lw=1.5, zorder=5)
    ax.set_xlim(0, m.width)
    ax.set_ylim(m.height, 0)
    ax.set_xlabel("x (core column)")


def _arrows(ax, mesh: MeshSpec, sent: dict[tuple[str, str], int]) -> None:
    """The bytes each tile sent over each link, as an arrow from its centre toward the neighbour's."""
    names = {str(t): t for t in mesh.tiles()}
    for (tile, link), nbytes in sorted(sent.items()):
        t = names.get(tile)
        if t is None or nbytes <= 0:
            continue
        d = Dir[link]
        n = mesh.tile_neighbour(t, d)
        if n is None:
            continue
        a, b = mesh.tile_region(t), mesh.tile_region(n)
        (ax0, ay0), (bx0, by0) = (a.x0 + a.w / 2, a.y0 + a.h / 2), (b.x0 + b.w / 2, b.y0 + b.h / 2)
        off = 0.08 * (a.h if d in (Dir.E, Dir.W) else a.w) * (1 if d in (Dir.E, Dir.S) else -1)
        dx, dy = (0, off) if d in (Dir.E, Dir.W) else (off, 0)
        start, end = (ax0 + 0.3 * (bx0 - ax0) + dx, ay0 + 0.3 * (by0 - ay0) + dy), \
                     (ax0 + 0.7 * (bx0 - ax0) + dx, ay0 + 0.7 * (by0 - ay0) + dy)
        ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "-|>", "color": "black", "lw": 1.2})
        ax.text((start[0] + end[0]) / 2 + dx, (start[1] + end[1]) / 2 + dy, _fmt_bytes(nbytes), **LABEL)


@dataclass(frozen=True, eq=False)
class Measured:
    """What a decode that ran gives the heatmap: its StageRuns, the seconds each tile spent computing, the
    bytes each tile sent over each link, and its wall time."""

    runs: Sequence[StageRun] | None = None
    busy: dict[str, float] | None = None
    sent: dict[tuple[str, str], int] | None = None
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        if self.wall_s < 0:
            raise ValueError(f"Measured.wall_s is seconds >= 0, got {self.wall_s!r}")


def heatmap_png(p: Placement, path: str | Path, measured: Measured | None = None, title: str | None = None) -> Path:
    """The three panels of placement `p` (with what a decode measured, when given) as a PNG at `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    m = p.mesh
    panel = 5.0
    fig = Figure(figsize=(3 * panel + 1.5, max(3.4, panel * m.height / m.width) + 1.9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3, sharey=True)
    _sram_panel(fig, axes[0], p)
    got = measured or Measured()
    _link_panel(fig, axes[1], p, got.runs, got.sent)
    _busy_panel(fig, axes[2], p, got.busy, got.wall_s)
    axes[0].set_ylabel("y (core row)")
    fig.suptitle(title or f"{m}: {len(p.layers)} layers + embedding/head on {p.spec.name}", fontsize=11)
    fig.text(0.5, 0.015, "dashed: tile borders (one Ray actor each)    white: stage regions    red x: dead core"
             "    green: spare core (kept for repair)", ha="center", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    with atomic_path(path) as tmp:  # whole or not at all
        fig.savefig(tmp, dpi=100)
    return Path(path)


def _panel(fig, ax, img, cmap: str, vmax: float, label: str) -> None:
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    m = img.shape
    im = ax.imshow(np.ma.masked_invalid(img), extent=(0, m[1], m[0], 0), cmap=colormaps[cmap],
                   norm=Normalize(0, vmax), interpolation="nearest")
    ax.set_facecolor("0.92")
    fig.colorbar(im, ax=ax, shrink=0.8, label=label)


def _sram_panel(fig, ax, p: Placement) -> None:
    sram = sram_share(p)
    _panel(fig, ax, np.where(sram > 0, sram * 100, np.nan), "magma", 100, "% of the core's SRAM booked")
    _outline(ax, p, spare=True)
    ax.set_title(f"SRAM booked per core (of {p.spec.sram_bytes // 1024} KB): fullest {sram.max():.0%}", fontsize=9)


def _link_panel(fig, ax, p: Placement, runs, sent) -> None:
    links = link_bytes(p, runs)
    scale, unit = (1e6, "MB") if links.max() >= 1e6 else (1e3, "KB")
    _panel(fig, ax, np.where(links > 0, links / scale, np.nan), "viridis", links.max() / scale,
           f"{unit} over the core's links (modelled)")
    _outline(ax, p)
    if sent:
        _arrows(ax, p.mesh, sent)
    what = "every token that ran" if runs is not None else "one token, a full K/V"
    ax.set_title(f"Link traffic per core, modelled ({what}): each\nregion's bytes spread over its cores"
                 + ("; arrows: bytes\nthe tiles sent each other (measured)" if sent else ""), fontsize=9)


def _busy_panel(fig, ax, p: Placement, busy, wall_s: float) -> None:
    m = p.mesh
    measured = busy is not None and wall_s > 0
    shares = {t: busy.get(str(t), 0.0) / wall_s for t in m.tiles()} if measured else modelled_busy(p)
    _panel(fig, ax, _tile_image(m, {t: v * 100 for t, v in shares.items()}), "Oranges", 100,
           "% of the decode's wall time computing" if measured else "% of the busiest tile's cycles")
    _outline(ax, p)
    for t, v in shares.items():
        r = m.tile_region(t)
        extra = f"\n{busy.get(str(t), 0.0):.2f} s" if measured else ""
        ax.text(r.x0 + r.w / 2, r.y0 + r.h / 2, f"{t}\n{v:.0%}{extra}", **LABEL)
    ax.set_title(f"Busy per tile (measured): computing,\nof the {wall_s:.2f} s decode" if measured else
                 "Busy per tile (modelled): cycles per token,\nof the busiest tile's", fontsize=9)
