"""Where an MoE layer's experts sit in its region: the expert mappings, each expert's block, its SRAM.

Contract: an MoE layer region (R x C cores: its attention runs as a dense layer's) is cut into a grid of
gx x gy expert *blocks* by a mapping (:func:`expert_grid`), rows and columns cut as evenly as they go;
expert e sits on block e // per_block (consecutive experts share a block when there are more experts than
blocks, and run there one after the other). An expert on its block is a MeshGEMV SwiGLU of its own
(:func:`expert_layouts`: hidden over the block's rows, dim over its columns).

- ``naive``: experts in blocks, the grid as square as the experts allow (MoEntwine's baseline).
- ``er`` (ER-Mapping, MoEntwine): the experts entwine with the attention's layout. After the attention the
  residual stream is split over the region's columns and replicated down its rows, so every row holds a
  full copy of the token (a *full token domain*); each expert takes a band of whole rows (gx = 1), so a
  token reaches each of its experts from the copy already in the band's rows: no dispatch hop.

What a region books for its experts does not depend on the mapping (:func:`expert_core_bytes`: the most
any mapping puts on a core, booked on every core), so experts can be re-mapped or moved without
re-planning the SRAM.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from waferrt.core.arith import cdiv
from waferrt.core.dtypes import itemsize
from waferrt.core.layout import Layout
from waferrt.core.mesh import Region
from waferrt.model.config import LlamaConfig

MAPPINGS = ("er", "naive")


@dataclass(frozen=True)
class ExpertGrid:
    """gx x gy blocks; each holds per_block experts."""

    gx: int
    gy: int
    per_block: int

    def __post_init__(self) -> None:
        if min(self.gx, self.gy, self.per_block) < 1:
            raise ValueError(f"an expert grid needs at least one block and one expert per block, got {self}")


def expert_grid(n_experts: int, region: Region, mapping: str) -> ExpertGrid:
    """The grid of blocks `mapping` cuts `region` into for `n_experts` experts (see the module docstring)."""
    if mapping not in MAPPINGS:
        raise ValueError(f"expert mapping {mapping!r} is not one of {', '.join(MAPPINGS)}")
    if mapping == "er":
        gy = max(n for n in _divisors(n_experts) if n <= region.h)
        return ExpertGrid(1, gy, n_experts // gy)
    shapes = [(gx, gy) for gx, gy in _grids(n_experts) if gx <= region.w and gy <= region.h]
    gx, gy = max(shapes, key=lambda s: (s[0] * s[1], -abs(region.w / s[0] - region.h / s[1])))
    return ExpertGrid(gx, gy, n_experts // (gx * gy))


@lru_cache(maxsize=64)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@lru_cache(maxsize=64)
def _grids(n_experts: int) -> tuple[tuple[int, int], ...]:
    """Every (gx, gy) whose gx * gy blocks share the experts out evenly, by blocks then columns (the order
    expert_grid takes the first of equals in)."""
    return tuple((gx, n // gx) for n in _divisors(n_experts) for gx in _divisors(n))


def _cuts(n: int, parts: int) -> list[tuple[int, int]]:
    """[a, b) of `parts` near-equal consecutive pieces of range(n) (the larger ones first)."""
    base, extra = divmod(n, parts)
    ends = [0]
    for i in range(parts):
        ends.append(ends[-1] + base + (i < extra))
    return list(zip(ends, ends[1:]))


def _sizes(n: int, parts: int) -> tuple[int, ...]:
    """The sizes of _cuts(n, parts)'s pieces, each once (the larger first)."""
    base, extra = divmod(n, parts)
    return (base + 1, base) if extra else (base,)


def expert_blocks(n_experts: int, region: Region, mapping: str) -> tuple[Region, ...]:
    """The block of every expert (expert e -> block e // per_block; blocks in row-major order)."""
    g = expert_grid(n_experts, region, mapping)
    grid = [Region(region.x0 + x0, region.y0 + y0, x1 - x0, y1 - y0)
            for y0, y1 in _cuts(region.h, g.gy) for x0, x1 in _cuts(region.w, g.gx)]
    return tuple(grid[e // g.per_block] for e in range(n_experts))


def expert_layouts(config: LlamaConfig, block: Region, dtype: str = "float32") -> dict[str, Layout]:
    """One expert's matrices over its block (MeshGEMV: hidden over rows, dim over columns)."""
    return {"w_gate": Layout((config.hidden_dim, config.dim), block, ("y", "x"), dtype=dtype),
            "w_up": Layout((config.hidden_dim, config.dim), block, ("y", "x"), dtype=dtype),
            "w_down": Layout((config.dim, config.hidden_dim), block, ("x", "y"), dtype=dtype)}


def router_layout(config: LlamaConfig, region: Region, dtype: str = "float32") -> Layout:
    """The router (n_experts, dim) over the whole layer region: dim over the columns, every row a copy (its
    row allreduce leaves every logit on every core, each row computing the same)."""
    return Layout((config.n_experts, config.dim), region, (None, "x"), dtype=dtype)


def expert_core_bytes(config: LlamaConfig, region: Region, dtype: str = "float32") -> int:
    """The most bytes of expert weights any mapping puts on one core of `region` (a block's busiest core,
    times the experts stacked there)."""
    return _most(config, region.w, region.h, dtype)[0]


def moe_scratch_words(config: LlamaConfig, region: Region) -> int:
    """The float32 words of an MoE layer's own scratch on a core, under any mapping: every logit, the
    token's chunk in the narrowest block, an expert's hidden pair in the shortest."""
    return _most(config, region.w, region.h, "float32")[1]


@lru_cache(maxsize=65536)
def _most(config: LlamaConfig, w: int, h: int, dtype: str) -> tuple[int, int]:
    region, most, words = Region(0, 0, w, h), 0, 0
    for mapping in MAPPINGS:  # every block holds experts (gx * gy divides them): each shape of block
        g = expert_grid(config.n_experts, region, mapping)
        for bw in _sizes(w, g.gx):
            for bh in _sizes(h, g.gy):
                most = max(most, g.per_block * _expert_bytes(config, bw, bh, dtype))
                words = max(words, cdiv(config.dim, bw) + 2 * cdiv(config.hidden_dim, bh))
    return most, config.n_experts + words


@lru_cache(maxsize=65536)
def _expert_bytes(config: LlamaConfig, w: int, h: int, dtype: str) -> int:
    """The busiest core's bytes of one expert's matrices on a w x h block (the same wherever the block lies):
    expert_layouts' largest blocks in closed form (tested equal), w_gate's and w_up's cdiv(hidden_dim, h) x
    cdiv(dim, w) and w_down's, their transpose."""
    if w > config.dim or h > config.hidden_dim:
        raise ValueError(f"an expert's block of {w}x{h} cores cuts dim {config.dim} over its columns and hidden_dim "
                         f"{config.hidden_dim} over its rows: use at most that many of each")
    return 3 * cdiv(config.hidden_dim, h) * cdiv(config.dim, w) * itemsize(dtype)
