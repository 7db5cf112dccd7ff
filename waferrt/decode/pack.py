"""Packing a Llama's weights into the per-core blocks of the wafer decode, ready to compute on.

Contract: pure functions from full float32 weights (y = W @ x, W (out, in)) and a region to the
arrays a tile keeps for that region. The block contents are exactly the MeshGEMV blocks of
waferrt.decode.layout (each core (r, c) owns W[out chunk, in chunk]); each matrix keeps its blocks as one
C-contiguous (lines * out_block, cores per line * in_block) matrix -- out by in, the output lines' blocks
one after another, a line's cores' blocks side by side along the input -- so that a tile runs every
core's local GEMV of a micro-batch as a few BLAS calls over contiguous panels of output rows
(waferrt.decode.net: Net.gemv), and core (r, c)'s block is still one rectangle of it:

- input split over columns, output over rows (wqkv, w13; the table): (rows * out_block, cols * in_block).
- input split over rows, output over columns (wo, w_down): (cols * out_block, rows * in_block).
Vectors split over columns (x, norm weights) are (cols, chunk), zero-padded where chunks are uneven.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from waferrt.core.dtypes import storage_dtype, to_f32, to_storage
from waferrt.core.layout import Chunks, Layout, to_blocks
from waferrt.core.mesh import Region
from waferrt.core.pages import drop_pages
from waferrt.model.config import LlamaConfig

from .layout import final_norm_layout, layer_layouts

__all__ = ["Chunks", "pack_embed", "pack_ffn", "pack_layer", "pack_matrix"]  # Chunks: core.layout's, for the tiles


def out_in(blocks: np.ndarray, out_over: str) -> np.ndarray:
    """(rows, cols, *out, in) blocks -> one (lines * prod(out), cores * in) matrix: the output split over the
    region's rows (`out_over` "y": lines are rows, the input over columns) or its columns ("x")."""
    r, c, i = blocks.shape[0], blocks.shape[1], blocks.shape[-1]
    b = blocks.reshape(r, c, -1, i)  # (R, C, out, in)
    lines = b.transpose(0, 2, 1, 3) if out_over == "y" else b.transpose(1, 2, 0, 3)  # (line, out, core, in)
    return np.ascontiguousarray(lines).reshape(lines.shape[0] * lines.shape[1], -1)


def blocks_of(matrix: np.ndarray, out_over: str, region: Region) -> np.ndarray:
    """Inverse of out_in: a packed (lines * out, cores * in) matrix of `region` -> (rows, cols, out, in)."""
    lines, cores = (region.h, region.w) if out_over == "y" else (region.w, region.h)
    b = matrix.reshape(lines, matrix.shape[0] // lines, cores, matrix.shape[1] // cores)  # (line, out, core, in)
    return b.transpose(0, 2, 1, 3) if out_over == "y" else b.transpose(2, 0, 1, 3)


def _joined(cuts) -> np.ndarray:
    """out_in(..., "y") of several matrices joined along the outputs (a row's part 0 outputs, then part 1's
    ...). `cuts`: (make, Layout) pairs, `make()` giving the matrix in its storage form; each is cut and copied
    straight into place one at a time, so the packing holds the result and one part (at real sizes a
    Llama3-8B layer is 436 MB in float16)."""
    outs = [int(np.prod(lay.max_block_shape()[:-1])) for _, lay in cuts]
    region, width = cuts[0][1].region, cuts[0][1].max_block_shape()[-1]
    out = np.empty((region.h, sum(outs), region.w, width), np.dtype(cuts[0][1].dtype))
    start = 0
    for (make, lay), n in zip(cuts, outs, strict=True):
        blocks = to_blocks(make(), lay).reshape(region.h, region.w, n, width)
        out[:, start:start + n] = blocks.transpose(0, 2, 1, 3)
        start += n
    return out.reshape(region.h * start, region.w * width)


def pack_layer(config: LlamaConfig, lw, region: Region, dtype: str = "float32") -> dict[str, np.ndarray]:
    """One layer's weights as the arrays of its region (see the module docstring). Each matrix is put in
    `dtype` first and cut in it (rounding is element-wise: the same blocks as cutting in float32 and storing
    after), one at a time: at real sizes (a Llama3-8B layer is 436 MB in float16) the packing holds little
    more than its result."""
    lay = {k: replace(v, dtype=storage_dtype(dtype).name) for k, v in layer_layouts(config, region).items()}
    hd, nh, nkv = config.head_dim, config.n_heads, config.n_kv_heads

    def stored(a: np.ndarray, *shape: int) -> np.ndarray:  # weights in `dtype`'s numpy form, reshaped
        out = to_storage(a, dtype)
        if not np.shares_memory(out, a):  # converted: the mapped float32 source's pages go back (core.pages)
            drop_pages(a)
        return out.reshape(shape or a.shape)

    def cut(a: np.ndarray, key: str, *shape: int):  # made when _joined takes it
        return (lambda: stored(a, *shape)), lay[key]

    o = to_blocks(stored(lw.wo, config.dim, nh, hd), lay["wo"])  # (R, C, dim_c, nh, hd_r)
    packed = {
        "wqkv": _joined([cut(lw.wq, "wq", nh, hd, config.dim), cut(lw.wk, "wk", nkv, hd, config.dim),
                         cut(lw.wv, "wv", nkv, hd, config.dim)]),  # (R*(nh+2nkv)*hd_r, C*dim_c)
        "wo": out_in(o.reshape(o.shape[:3] + (-1,)), "x"),  # (C*dim_c, R*nh*hd_r)
        "attn_norm": to_blocks(stored(lw.attn_norm), lay["attn_norm"])[0],  # (C, dim_c)
        "ffn_norm": to_blocks(stored(lw.ffn_norm), lay["ffn_norm"])[0],
    }
    if lw.w_gate is not None:  # the dense FFN (an MoE layer's shared expert)
        gate, up, down = ((lambda w=w: stored(w)) for w in (lw.w_gate, lw.w_up, lw.w_down))
        packed.update(pack_ffn(gate, up, down, lay))
    return packed


def pack_ffn(gate: Callable[[], np.ndarray], up: Callable[[], np.ndarray], down: Callable[[], np.ndarray],
             lay: dict) -> dict[str, np.ndarray]:
    """A SwiGLU FFN's matrices as "w13" (R*2*hid_r, C*dim_c) and "w2" (C*dim_c, R*hid_r), cut by the layouts
    lay["w_gate"], lay["w_up"], lay["w_down"] over their region; `gate`, `up`, `down` are callables giving
    each matrix in the layouts' dtype (made one at a time)."""
    return {"w13": _joined([(gate, lay["w_gate"]), (up, lay["w_up"])]),  # (R*2*hid_r, C*dim_c)
            "w2": out_in(to_blocks(down(), lay["w_down"]), "x")}  # (C*dim_c, R*hid_r)


def pack_matrix(w: np.ndarray, lay: Layout) -> np.ndarray:
    """A matrix whose input is split over columns (out: y, in: x), e.g. a router: (R*out_r, C*in_c)."""
    return out_in(to_blocks(w, lay), "y")


ROWS_PER_BLOCK = 4096  # vocabulary rows cut at a time (the table is never copied whole)


def pack_embed(config: LlamaConfig, embed, final_norm: np.ndarray, region: Region,
               dtype: str = "float32", widened: bool = False) -> dict[str, np.ndarray]:
    """The embedding's (or a head's) table as (rows * vocab_block, cols * dim_c) -- core (r, c) holds its
    vocabulary chunk r's rows of dim chunk c -- and the final norm (cols, dim_c). The table is cut block of rows
    by block of rows into the one output array; `embed` is an array, or anything with ``shape`` and
    ``read_rows(r0, r1)`` (a table read from its file a block at a time). `widened`: the table is held in
    float32, each block rounded to `dtype` first (the values the cores hold, in the form the host computes the
    head's GEMV with: converted once as it is cut, never held at both widths -- a Llama3-8B head is 1 GB in
    float16, 2 GB widened)."""
    vocab, dims = Chunks(config.vocab_size, region.h), Chunks(config.dim, region.w)
    voc_r = vocab.index.shape[1]
    place = np.empty(config.vocab_size, np.int64)  # vocabulary row -> its place on its core row's block axis
    place[vocab.index[vocab.valid]] = np.flatnonzero(vocab.valid.reshape(-1))
    out = np.zeros((region.h * voc_r, region.w * dims.index.shape[1]), np.float32 if widened else storage_dtype(dtype))
    read = getattr(embed, "read_rows", None) or (lambda r0, r1: np.asarray(embed[r0:r1]))
    for r0 in range(0, config.vocab_size, ROWS_PER_BLOCK):
        r1 = min(r0 + ROWS_PER_BLOCK, config.vocab_size)
        source = read(r0, r1)
        block = dims.split(to_storage(source, dtype))  # (n, C, dim_c), stored before it is cut
        if not np.shares_memory(block, source):
            drop_pages(source)  # a mapped float32 block's pages go back (core.pages)
        out[place[r0:r1]] = to_f32(block, dtype).reshape(r1 - r0, -1) if widened else block.reshape(r1 - r0, -1)
    return {"table": out, "final_norm": to_storage(to_blocks(final_norm, final_norm_layout(config, region))[0], dtype)}


def rope_tables(config: LlamaConfig, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(inverse frequencies (rows, pairs_r) float64, valid (rows, pairs_r)): the RoPE pairs of head_dim
    each row of a layer region holds (head_dim is split over rows in whole pairs)."""
    half = config.head_dim // 2
    inv = float(config.rope_theta) ** (-np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim)
    ch = Chunks(half, rows)
    return np.where(ch.valid, inv[ch.index], 0.0), ch.valid
