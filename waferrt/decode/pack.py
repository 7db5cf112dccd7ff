"""Packing a Llama's weights into the per-core blocks of the wafer decode, ready to compute on.

Contract: pure functions from full float32 weights (y = W @ x, W (out, in)) and a region to the
arrays a tile keeps for that region. The block contents are exactly the MeshGEMV blocks of
waferrt.decode.layout (each core (r, c) owns W[out chunk, in chunk]); the arrays group the blocks so a
tile can run every core's local GEMV as one batched matmul:

- input split over columns (wqkv, w13): (cols, in_block, rows * out_block): the cores of one column
  share that column's input chunk, so their blocks stack along the output axis (stored transposed:
  x (cols, 1, in) @ w is one batched row-times-matrix, the fastest form for numpy here).
- input split over rows (wo, w_down): (rows, in_block, cols * out_block).
Vectors split over columns (x, norm weights) are (cols, chunk), zero-padded where chunks are uneven.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.dtypes import storage_dtype, to_storage
from waferrt.core.layout import Layout, axis_gather, to_blocks
from waferrt.core.mesh import Region
from waferrt.model.config import LlamaConfig

from .layout import final_norm_layout, layer_layouts


class Chunks:
    """Split vectors (..., n) over `parts` cores (padded (..., parts, width)) and join them back."""

    def __init__(self, n: int, parts: int, granule: int = 1):
        lay = Layout((n,), Region(0, 0, parts, 1), ("x",), (granule,))
        self.index, self.valid = axis_gather(lay, 0)
        self.n = n

    def split(self, v: np.ndarray) -> np.ndarray:
        return np.where(self.valid, v[..., self.index], v.dtype.type(0))

    def join(self, a: np.ndarray) -> np.ndarray:
        out = np.empty(a.shape[:-2] + (self.n,), a.dtype)
        out[..., self.index[self.valid]] = a[..., self.valid]
        return out


def _cols_first(blocks: np.ndarray) -> np.ndarray:
    """(rows, cols, *out, in) -> (cols, in, rows * prod(out)): x (cols, 1, in) @ this is every core's GEMV."""
    c = blocks.shape[1]
    stacked = blocks.swapaxes(0, 1).reshape(c, -1, blocks.shape[-1])  # (cols, rows*out, in)
    return np.ascontiguousarray(stacked.swapaxes(1, 2))


def _rows_first(blocks: np.ndarray) -> np.ndarray:
    """(rows, cols, *out, in) -> (rows, in, cols * prod(out))."""
    r = blocks.shape[0]
    return np.ascontiguousarray(blocks.reshape(r, -1, blocks.shape[-1]).swapaxes(1, 2))


def pack_layer(cfg: LlamaConfig, lw, region: Region, dtype: str = "float32") -> dict[str, np.ndarray]:
    """One layer's weights as the arrays of its region (see the module docstring)."""
    lay = layer_layouts(cfg, region)  # blocks cut in float32, stored in `dtype` below
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    q = to_blocks(lw.wq.reshape(nh, hd, cfg.dim), lay["wq"])  # (R, C, nh, hd_r, dim_c)
    k = to_blocks(lw.wk.reshape(nkv, hd, cfg.dim), lay["wk"])  # (R, C, nkv, hd_r, dim_c)
    v = to_blocks(lw.wv.reshape(nkv, hd, cfg.dim), lay["wv"])
    o = to_blocks(lw.wo.reshape(cfg.dim, nh, hd), lay["wo"])  # (R, C, dim_c, nh, hd_r)
    packed = {
        "wqkv": _cols_first(np.concatenate([q, k, v], axis=2)),  # (C, dim_c, R*(nh+2nkv)*hd_r)
        "wo": _rows_first(o.reshape(o.shape[:3] + (-1,))),  # (R, nh*hd_r, C*dim_c)
        "attn_norm": to_blocks(lw.attn_norm, lay["attn_norm"])[0],  # (C, dim_c)
        "ffn_norm": to_blocks(lw.ffn_norm, lay["ffn_norm"])[0],
    }
    if lw.w_gate is not None:  # the dense FFN (an MoE layer's shared expert)
        packed.update(pack_ffn((lw.w_gate, lw.w_up, lw.w_down), lay))
    return {k: to_storage(v, dtype) for k, v in packed.items()}


def pack_ffn(gate_up_down: tuple[np.ndarray, ...], lay: dict) -> dict[str, np.ndarray]:
    """A SwiGLU FFN's matrices (float32) as "w13" (C, dim_c, R*2*hid_r) and "w2" (R, hid_r, C*dim_c), cut by
    the layouts lay["w_gate"], lay["w_up"], lay["w_down"] over their region."""
    gate, up, down = (to_blocks(w, lay[name]) for w, name in zip(gate_up_down, ("w_gate", "w_up", "w_down")))
    # gate, up (R, C, hid_r, dim_c); down (R, C, dim_c, hid_r)
    return {"w13": _cols_first(np.stack([gate, up], axis=2)), "w2": _rows_first(down)}


def pack_matrix(w: np.ndarray, lay: Layout) -> np.ndarray:
    """A matrix whose input is split over columns (out: y, in: x), e.g. a router: (C, in_c, R*out_r)."""
    return _cols_first(to_blocks(w, lay))


ROWS_PER_BLOCK = 4096  # vocabulary rows cut at a time (the table is never copied whole)


def pack_embed(cfg: LlamaConfig, embed, final_norm: np.ndarray, region: Region,
               dtype: str = "float32") -> dict[str, np.ndarray]:
    """The tied embedding/head table as (cols, dim_c, rows * vocab_block) -- core (r, c) holds its vocabulary
    chunk r's rows of dim chunk c -- and the final norm (cols, dim_c). The table is cut block of rows by
    block of rows into the one output array; `embed` is an array, or anything with ``shape`` and
    ``read_rows(r0, r1)`` (a table read from its file a block at a time)."""
    vocab, dims = Chunks(cfg.vocab_size, region.h), Chunks(cfg.dim, region.w)
    voc_r = vocab.index.shape[1]
    place = np.empty(cfg.vocab_size, np.int64)  # vocabulary row -> its place on its core row's block axis
    place[vocab.index[vocab.valid]] = np.flatnonzero(vocab.valid.reshape(-1))
    out = np.zeros((region.w, dims.index.shape[1], region.h * voc_r), storage_dtype(dtype))
    read = getattr(embed, "read_rows", None) or (lambda r0, r1: np.asarray(embed[r0:r1]))
    for r0 in range(0, cfg.vocab_size, ROWS_PER_BLOCK):
        r1 = min(r0 + ROWS_PER_BLOCK, cfg.vocab_size)
        block = dims.split(read(r0, r1).astype(np.float32, copy=False))  # (n, C, dim_c)
        out[:, :, place[r0:r1]] = to_storage(block.transpose(1, 2, 0), dtype)
    return {"table": out, "final_norm": to_storage(to_blocks(final_norm, final_norm_layout(cfg, region))[0], dtype)}


def rope_tables(cfg: LlamaConfig, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(inverse frequencies (rows, pairs_r) float64, valid (rows, pairs_r)): the RoPE pairs of head_dim
    each row of a layer region holds (head_dim is split over rows in whole pairs)."""
    half = cfg.head_dim // 2
    inv = float(cfg.rope_theta) ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    ch = Chunks(half, rows)
    return np.where(ch.valid, inv[ch.index], 0.0), ch.valid
