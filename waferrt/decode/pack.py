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

from dataclasses import replace

import numpy as np

from waferrt.core.dtypes import storage_dtype, to_storage
from waferrt.core.layout import Chunks, Layout, to_blocks
from waferrt.core.mesh import Region
from waferrt.model.config import LlamaConfig

from .layout import final_norm_layout, layer_layouts

__all__ = ["Chunks", "pack_embed", "pack_ffn", "pack_layer", "pack_matrix"]  # Chunks: core.layout's, for the tiles


def _cols_first(cuts) -> np.ndarray:
    """Matrices cut into (rows, cols, *out_j, in) blocks -- `cuts`: (array, Layout) pairs, cut one at a time --
    joined along the outputs: (cols, in, rows * sum(out_j)), row r's outputs part 0's then part 1's ...;
    x (cols, 1, in) @ this is every core's GEMV. Each part goes straight into place (one copy), so the packing
    holds the result and one part at a time."""
    cuts = list(cuts)
    outs = [int(np.prod(lay.max_block_shape()[:-1])) for _, lay in cuts]
    rows, cols, width = cuts[0][1].region.h, cuts[0][1].region.w, cuts[0][1].max_block_shape()[-1]
    out = np.empty((cols, width, rows, sum(outs)), np.dtype(cuts[0][1].dtype))
    start = 0
    for (a, lay), n in zip(cuts, outs):
        blocks = to_blocks(a, lay).reshape(rows, cols, n, width)
        out[:, :, :, start:start + n] = blocks.transpose(1, 3, 0, 2)
        start += n
    return out.reshape(cols, width, rows * start)


def _rows_first(blocks: np.ndarray) -> np.ndarray:
    """(rows, cols, *out, in) -> (rows, in, cols * prod(out))."""
    r = blocks.shape[0]
    return np.ascontiguousarray(blocks.reshape(r, -1, blocks.shape[-1]).swapaxes(1, 2))


def _heads_joined(o: np.ndarray) -> np.ndarray:
    """wo's blocks (R, C, dim_c, nh, hd_r) with the heads' inputs as one axis: (R, C, dim_c, nh*hd_r)."""
    return o.reshape(o.shape[:3] + (-1,))


def pack_layer(cfg: LlamaConfig, lw, region: Region, dtype: str = "float32") -> dict[str, np.ndarray]:
    """One layer's weights as the arrays of its region (see the module docstring). Each matrix is put in
    `dtype` first and cut in it (rounding is element-wise: the same blocks as cutting in float32 and storing
    after), one at a time: at real sizes (a Llama3-8B layer is 436 MB in float16) the packing holds little
    more than its result."""
    lay = {k: replace(v, dtype=storage_dtype(dtype).name) for k, v in layer_layouts(cfg, region).items()}
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

    def stored(a: np.ndarray, *shape: int) -> np.ndarray:  # weights in `dtype`'s numpy form, reshaped
        return to_storage(a, dtype).reshape(shape or a.shape)

    packed = {
        "wqkv": _cols_first([(stored(lw.wq, nh, hd, cfg.dim), lay["wq"]), (stored(lw.wk, nkv, hd, cfg.dim), lay["wk"]),
                             (stored(lw.wv, nkv, hd, cfg.dim), lay["wv"])]),  # (C, dim_c, R*(nh+2nkv)*hd_r)
        "wo": _rows_first(_heads_joined(to_blocks(stored(lw.wo, cfg.dim, nh, hd), lay["wo"]))),  # (R, nh*hd_r, C*dim_c)
        "attn_norm": to_blocks(stored(lw.attn_norm), lay["attn_norm"])[0],  # (C, dim_c)
        "ffn_norm": to_blocks(stored(lw.ffn_norm), lay["ffn_norm"])[0],
    }
    if lw.w_gate is not None:  # the dense FFN (an MoE layer's shared expert)
        packed.update(pack_ffn(tuple(stored(w) for w in (lw.w_gate, lw.w_up, lw.w_down)), lay))
    return packed


def pack_ffn(gate_up_down: tuple[np.ndarray, ...], lay: dict) -> dict[str, np.ndarray]:
    """A SwiGLU FFN's matrices (in the layouts' dtype) as "w13" (C, dim_c, R*2*hid_r) and "w2" (R, hid_r,
    C*dim_c), cut by the layouts lay["w_gate"], lay["w_up"], lay["w_down"] over their region."""
    gate, up, down = gate_up_down
    return {"w13": _cols_first([(gate, lay["w_gate"]), (up, lay["w_up"])]),  # (C, dim_c, R*2*hid_r)
            "w2": _rows_first(to_blocks(down, lay["w_down"]))}  # (R, hid_r, C*dim_c)


def pack_matrix(w: np.ndarray, lay: Layout) -> np.ndarray:
    """A matrix whose input is split over columns (out: y, in: x), e.g. a router: (C, in_c, R*out_r)."""
    return _cols_first([(w, lay)])


ROWS_PER_BLOCK = 4096  # vocabulary rows cut at a time (the table is never copied whole)


def pack_embed(cfg: LlamaConfig, embed, final_norm: np.ndarray, region: Region,
               dtype: str = "float32") -> dict[str, np.ndarray]:
    """The tied embedding/head table as (cols, dim_c, rows * vocab_block) -- core (r, c) holds its vocabulary
    chunk r's rows of dim chunk c -- and the final norm (cols, dim_c). The table is cut block of rows by
    block of rows into the one output array; `embed` is an array, or anything with ``shape`` and
    ``read_rows(r0, r1)`` (a table read from its file a block at a time)."""
    vocab, dims = Chunks(cfg.vocab_size, region.h), Chunks(cfg.dim, region.w)
    voc_r = vocab.index.shape[1]
    out = np.zeros((region.w, dims.index.shape[1], region.h * voc_r), storage_dtype(dtype))
    read = getattr(embed, "read_rows", None) or (lambda r0, r1: np.asarray(embed[r0:r1]))
    for r, (first, n) in enumerate(zip(vocab.index[:, 0].tolist(), vocab.valid.sum(axis=1).tolist())):
        for i in range(0, n, ROWS_PER_BLOCK):  # core row r holds vocabulary rows first .. first + n - 1
            j = min(i + ROWS_PER_BLOCK, n)
            block = dims.split(to_storage(read(first + i, first + j), dtype))  # (j - i, C, dim_c)
            out[:, :, r * voc_r + i: r * voc_r + j] = block.transpose(1, 2, 0)
    return {"table": out, "final_norm": to_storage(to_blocks(final_norm, final_norm_layout(cfg, region))[0], dtype)}


def rope_tables(cfg: LlamaConfig, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(inverse frequencies (rows, pairs_r) float64, valid (rows, pairs_r)): the RoPE pairs of head_dim
    each row of a layer region holds (head_dim is split over rows in whole pairs)."""
    half = cfg.head_dim // 2
    inv = float(cfg.rope_theta) ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    ch = Chunks(half, rows)
    return np.where(ch.valid, inv[ch.index], 0.0), ch.valid
