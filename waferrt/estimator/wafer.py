"""Region shapes at wafer scale, in closed form: what a core of a layer region holds, which shapes fit, where
the regions go. Nothing is placed core by core, so a 750x994-core wafer answers in milliseconds.

Contract (pure): a :class:`Shape` is a layer region's (cols, rows, head_groups). ``layer_core_bytes`` is the
most loaded core of a region running `layers` layers (their weight blocks and K/V stacked, one scratch
area), equal to ``waferrt.decode.layout.layer_core_bytes`` for one layer and one head group (tested: the
layouts the tiles book); ``min_cols`` the narrowest region of a given height that fits in SRAM; ``Floor`` is
the wafer's floor plan: the embedding (and, for an untied model, the output head) as full-width bands on
top, layer regions in a grid of slots below them, taken in a serpentine so that consecutive regions touch;
``stages`` gives the decode's stages (``decode.stage.chain``) for ``waferrt.decode.cost.step_cycles`` (one per
layer; the layers of a group share their region). ``floors`` lists every floor plan worth timing for a
strategy and ``strategies`` the strategies worth trying (both used by the estimator and by its advice)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from waferrt.core.arith import cdiv, first_true, last_true
from waferrt.core.mesh import Extent, Region
from waferrt.core.spec import HardwareSpec
from waferrt.decode.layout import activation_bytes, kv_core_bytes, layer_block_bytes, most_bytes, topk_booking
from waferrt.decode.stage import Stage, chain
from waferrt.model.config import LlamaConfig
from waferrt.model.sparse import DENSE, AttentionMode
from waferrt.scheduler import budget
from waferrt.scheduler.types import KVReserve, Strategy, Workload


@dataclass(frozen=True)
class Shape:
    """A layer region: cols x rows cores, its rows cut in head_groups groups (see decode.cost)."""

    cols: int
    rows: int
    head_groups: int = 1

    @property
    def cores(self) -> int:
        return self.cols * self.rows

    def region(self, x0: int = 0, y0: int = 0) -> Region:
        return Region(x0, y0, self.cols, self.rows)


def legal(config: LlamaConfig, shape: Shape, kv_tokens: int) -> bool:
    """Can a layer be cut over this shape? head_dim in whole RoPE pairs over a group's rows, K/V heads
    shared out evenly, dim and the K/V positions over the columns, hidden_dim over the rows."""
    g = shape.head_groups
    return (g >= 1 and config.n_kv_heads % g == 0 and shape.rows % g == 0 and shape.rows // g <= config.head_dim // 2
            and 1 <= shape.cols <= min(config.dim, kv_tokens) and shape.rows <= config.hidden_dim)


@lru_cache(maxsize=1 << 16)  # the floor plans' searches ask for the same shapes again (about 5 times each)
def layer_core_bytes(work: Workload, shape: Shape, kv: bool = True, weights: bool = True) -> int:
    """Bytes of the most loaded core of a region running `work.layers` layers: their weight blocks (unless
    `weights` is False: streamed in, see streaming.py) and K/V (`work.kv`: requests x tokens positions each)
    stacked, plus one float32 scratch area (activation_bytes of decode.layout, per head group)."""
    config, dtype, region, groups = work.config, work.dtype, shape.region(), shape.head_groups
    w = layer_block_bytes(config, region, dtype, groups)
    k_v = kv_core_bytes(config, region, work.kv.tokens, work.kv.requests, dtype, groups)
    scratch = activation_bytes(config, region, work.kv.tokens, groups)
    return work.layers * ((w if weights else 0) + (k_v if kv else 0)) + scratch


@lru_cache(maxsize=1 << 14)  # floors asks again for every band height, advice for every strategy it tests
def min_cols(work: Workload, rows: int, groups: int, sram: int) -> int | None:
    """The fewest columns of a `rows`-row region (rows in `groups` head groups) that holds its layers, or
    None (more columns only lower the bytes per core: bisection)."""
    return first_true(1, min(work.config.dim, work.kv.tokens), lambda c: _holds(work, Shape(c, rows, groups), sram))


def _holds(work: Workload, shape: Shape, sram: int) -> bool:
    """Can a region of `shape` run its layers in `sram` bytes per core?"""
    return legal(work.config, shape, work.kv.tokens) and layer_core_bytes(work, shape) <= sram


def shape_kv_capacity(work: Workload, shape: Shape, sram: int, attention: AttentionMode = DENSE) -> int:
    """The most K/V positions per request (up to the model's max_seq_len) the region holds with
    `work.kv.requests` requests (0: not even one); under sparse `attention` its cores also hold the top-K's
    lists (decode.layout.topk_booking, as the tiles book them)."""

    def fits(t: int) -> bool:
        topk = most_bytes(topk_booking(work.config, shape.region(), t, attention, shape.head_groups))
        return legal(work.config, shape, max(t, shape.cols)) and layer_core_bytes(work.holding(t), shape) + topk <= sram

    return last_true(1, work.config.max_seq_len, fits) or 0


@dataclass(frozen=True)
class Floor:
    """The floor plan of a mesh: `bands` full-width bands of band_rows rows on top (the embedding; for an
    untied model also the output head), then a grid of layer slots of `shape`."""

    width: int
    height: int
    band_cols: int
    band_rows: int
    bands: int
    shape: Shape

    @property
    def slots(self) -> int:
        free = self.height - self.bands * self.band_rows
        return (self.width // self.shape.cols) * max(free // self.shape.rows, 0)

    def slot(self, i: int) -> Region:
        """The i-th layer slot of the serpentine (rows of slots, alternating direction): consecutive ones touch."""
        per_row = self.width // self.shape.cols
        row, k = divmod(i, per_row)
        col = k if row % 2 == 0 else per_row - 1 - k
        return self.shape.region(col * self.shape.cols, self.bands * self.band_rows + row * self.shape.rows)

    def band(self, i: int) -> Region:
        return Region(0, i * self.band_rows, self.band_cols, self.band_rows)

    def stages(self, n_layers: int, group: int) -> tuple[Stage, ...]:
        """The decode's stages: the embedding band, every layer on its region (layer i on slot i // group:
        `group` layers per region, the last the rest), the head (the embedding band for a tied model, else the
        second band)."""
        slots = [self.slot(j) for j in range(cdiv(n_layers, group))]
        return chain(self.band(0), [slots[i // group] for i in range(n_layers)], self.band(self.bands - 1))


def band(config: LlamaConfig, sram: int, width: int, dtype: str) -> tuple[int, int] | None:
    """(cols, rows) of the embedding (or output head) band across a mesh `width` cores wide, or None when the
    table does not fit even one vocabulary row per core row."""
    cols = min(width, config.dim)
    rows = budget.embed_rows_needed(config, sram, cols, dtype)
    return None if rows is None else (cols, rows)


def row_options(config: LlamaConfig, max_rows: int) -> list[tuple[int, int]]:
    """(rows, head_groups) to try: every divisor G of n_kv_heads with rows/G a few values up to head_dim/2,
    within `max_rows`."""
    half = config.head_dim // 2
    per_group = sorted({r for r in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, half) if r <= half})
    out = []
    for g in (g for g in range(1, config.n_kv_heads + 1) if config.n_kv_heads % g == 0):
        out += [(g * r, g) for r in per_group if g * r <= max_rows]
    return out


COLS = tuple(sorted({1 << k for k in range(13)} | {3 << k for k in range(12)}))  # 1, 2, 3, 4, 6, 8, 12, ...


def col_options(lo: int, hi: int) -> list[int]:
    """Column counts from lo to hi: both ends and the fixed grid 1, 2, 3, 4, 6, 8, 12, ... between them (the
    same grid whatever lo is, so more SRAM per core never loses a shape that less SRAM could time)."""
    if hi <= lo:
        return [lo]
    return sorted({lo, hi, *(c for c in COLS if lo < c < hi)})


def floors(config: LlamaConfig, spec: HardwareSpec, mesh: Extent, kv: KVReserve, dtype: str,
           strategy: Strategy):
    """Every floor plan worth timing for `strategy`: bands of the fewest rows that hold the table, and of
    16, 32, 64 and 128 rows when taller (a taller band gives the output head more cores; a fixed grid, so
    more SRAM per core never loses a floor plan that less SRAM could time); for each (rows, head groups),
    column counts from the narrowest region that fits in SRAM to the widest whose regions all fit."""
    width, height = mesh.width, mesh.height
    work = Workload(config, kv, dtype, strategy.group)
    bands = 1 if config.tie_embeddings else 2
    b = band(config, spec.sram_bytes, width, dtype)
    if b is None:
        return
    for band_rows in sorted({b[1], *(r for r in (16, 32, 64, 128) if b[1] < r <= config.vocab_size)}):
        free = height - bands * band_rows
        if free < 1 or (band_rows > b[1] and free < height // 2):  # a taller band only while layers have room
            continue
        for rows, groups in row_options(config, free):
            hi = min(width // cdiv(strategy.regions, free // rows), config.dim, kv.tokens)
            if hi < 1 or not _holds(work, Shape(hi, rows, groups), spec.sram_bytes):
                continue  # not even the widest region that fits on the floor holds a layer: none narrower does
            for cols in col_options(min_cols(work, rows, groups, spec.sram_bytes), hi):
                yield Floor(width, height, b[0], band_rows, bands, Shape(cols, rows, groups))
