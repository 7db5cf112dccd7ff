"""SRAM budgets for planning: which layer region shapes fit, what each core holds, how many KV tokens fit.

Contract: pure functions over a :class:`~waferrt.scheduler.types.Workload` (the model, the K/V reserve, the
dtype, and ``layers``: how many layers a region runs, their weights and K/V stacked on the same cores) and
the per-core SRAM. Sizes come only from
:mod:`waferrt.decode.layout` (``layer_core_bytes`` / ``embed_core_bytes``: the maxima of what the tiles
book, so what is planned is what the decode places); a region shape whose layouts cannot be split
(``Layout`` raises ``ValueError``) counts as "does not fit".

- ``layer_shapes``: for every legal row count, the narrowest layer region that fits, best first
  (fewest cores, then wide rather than tall). K/V positions are split over a region's columns, so a region
  wider than the K/V reserve reserves one position per column (``kv_reserved``).
- ``region_kv_capacity``: the most KV positions per request a layer region holds (at least the reserve).
- ``embed_rows_needed`` / ``embed_cols_needed``: the smallest embedding region side for the other one.
- ``work_bytes``: weight bytes of the embedding/head region (an untied head's region holds as many) and of
  one layer region (decode work); ``model_bytes`` the whole model's.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from waferrt.core.arith import cdiv, first_true, last_true
from waferrt.core.dtypes import itemsize
from waferrt.core.mesh import Region
from waferrt.decode import layout as dl
from waferrt.model.config import LlamaConfig

from .types import Workload


def kv_reserved(tokens: int, w: int) -> int:
    """The K/V positions per request a w-column region reserves for a reserve of `tokens`: at least one
    per column (positions are split over the columns)."""
    return max(tokens, w)


def layer_bytes(work: Workload, w: int, h: int) -> int | None:
    """Bytes of the most loaded core of a w x h region running `work.layers` layers with `work.kv` (its
    tokens as they are: see kv_reserved) and, under sparse attention, the top-K's lists (once a region, as the
    tiles book them: decode.setup.stage_sram), or None when the shape cannot be split."""
    region = Region(0, 0, w, h)
    try:
        return (dl.layer_core_bytes(work.config, region, work.kv.tokens, work.kv.requests, work.dtype, work.layers)
                + dl.most_bytes(dl.topk_booking(work.config, region, work.kv.tokens, work.attention)))
    except ValueError:
        return None


def embed_bytes(config: LlamaConfig, w: int, h: int, dtype: str) -> int | None:
    """Bytes of the most loaded core of a w x h embedding region, or None when it cannot be split."""
    try:
        return dl.embed_core_bytes(config, Region(0, 0, w, h), dtype)
    except ValueError:
        return None


def _fits(nbytes: int | None, sram: int) -> bool:
    return nbytes is not None and nbytes <= sram


@lru_cache(maxsize=256)
def _all_layer_shapes(work: Workload, sram: int) -> tuple[tuple[int, int], ...]:
    config, shapes = work.config, []
    for h in range(1, dl.max_layer_rows(config) + 1):
        w = first_true(1, config.dim, lambda w, h=h: _fits(
            layer_bytes(work.holding(kv_reserved(work.kv.tokens, w)), w, h), sram))
        if w is not None:
            shapes.append((w, h))
    return tuple(sorted(shapes, key=lambda s: (s[0] * s[1], s[0] < s[1], s[1])))


def layer_shapes(work: Workload, sram: int, max_w: int, max_h: int) -> tuple[tuple[int, int], ...]:
    """(w, h) of the narrowest fitting region running `work.layers` layers for each row count h, best first.

    Columns are at most dim (a region wider than `tokens` reserves one K/V position per column); rows at
    most ``max_layer_rows(config)``. More columns only lower the per-core bytes, so the narrowest is the one
    that packs best, and the narrowest of at most `max_w` columns is the unbounded narrowest when that
    is at most `max_w` wide (else none fits): the shapes are computed once per model and KV reserve
    (cached) and only filtered by the mesh size, which the mesh search asks for many times.
    """
    return tuple(s for s in _all_layer_shapes(work, sram) if s[0] <= max_w and s[1] <= max_h)


def smallest_layer_bytes(work: Workload) -> tuple[int, Region]:
    """The least per-core bytes any legal region running `layers` layers reaches (the widest, tallest
    one), and that region. That region is always splittable: its rows are at most head_dim/2 <=
    hidden_dim and its columns at most dim."""
    config = work.config
    region = Region(0, 0, config.dim, dl.max_layer_rows(config))
    return layer_bytes(work.holding(kv_reserved(work.kv.tokens, config.dim)), region.w, region.h), region


@lru_cache(maxsize=4096)
def embed_rows_needed(config: LlamaConfig, sram: int, w: int, dtype: str) -> int | None:
    """Fewest rows of a w-column embedding region that fit in SRAM (None: not even one row per token)."""
    return first_true(1, config.vocab_size, lambda h: _fits(embed_bytes(config, w, h, dtype), sram))


@lru_cache(maxsize=4096)
def embed_cols_needed(config: LlamaConfig, sram: int, h: int, dtype: str) -> int | None:
    """Fewest columns of an h-row embedding region that fit in SRAM (None: not even one per dim)."""
    return first_true(1, config.dim, lambda w: _fits(embed_bytes(config, w, h, dtype), sram))


def embed_min_cores(config: LlamaConfig, sram: int, dtype: str) -> int:
    """A lower bound of the cores any embedding region needs: its table spread over full cores."""
    return cdiv(config.vocab_size * config.dim * itemsize(dtype), sram)


def region_kv_capacity(work: Workload, region: Region, sram: int) -> int:
    """Most KV positions per request (>= tokens and the region's columns, <= max(that, max_seq_len)) the
    region running `layers` layers holds."""
    tokens = kv_reserved(work.kv.tokens, region.w)
    top = max(tokens, work.config.max_seq_len)
    most = last_true(tokens, top, lambda t: _fits(layer_bytes(work.holding(t), region.w, region.h), sram))
    return tokens if most is None else most


def tensor_bytes(config: LlamaConfig, dtype: str) -> dict[str, int]:
    """Whole-tensor bytes of one layer's weights (by LAYER_WEIGHTS name), plus 'embed' and 'final_norm'."""
    unit = Region(0, 0, 1, 1)
    layouts = dl.layer_layouts(config, unit, dtype)
    out = {name: int(np.prod(lay.shape)) * lay.itemsize for name, lay in layouts.items()}
    out["embed"] = config.vocab_size * config.dim * itemsize(dtype)
    out["final_norm"] = config.dim * itemsize(dtype)
    return out


def work_bytes(config: LlamaConfig, dtype: str) -> tuple[int, int]:
    """(weight bytes of the embedding/head region: table + final norm, of one layer region): the decode
    reads each once per step, so they measure the CPU work a region gives its tile."""
    tb = tensor_bytes(config, dtype)
    return tb["embed"] + tb["final_norm"], sum(v for k, v in tb.items() if k not in ("embed", "final_norm"))


def kv_bytes(config: LlamaConfig, tokens: int, requests: int, dtype: str) -> int:
    """K and V of one layer for `requests` requests of `tokens` positions."""
    return 2 * requests * config.kv_dim * tokens * itemsize(dtype)


def head_tables(config: LlamaConfig) -> int:
    """How many embedding-shaped tables (each with its final norm) the model places: 1 tied, 2 untied."""
    return 1 if config.tie_embeddings else 2


def model_bytes(config: LlamaConfig, tokens: int, requests: int, dtype: str) -> tuple[int, int]:
    """(weight bytes, KV reserve bytes) of the whole model as the emulator places it (a tied table once, an
    untied head as a second table with its final norm): the least SRAM a placement needs."""
    embed, layer = work_bytes(config, dtype)
    weights = config.n_layers * layer + head_tables(config) * embed
    return weights, config.n_layers * kv_bytes(config, tokens, requests, dtype)
