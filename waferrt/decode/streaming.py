"""Weight streaming (Cerebras' way): the weights stay off the wafer (MemoryX) and stream into one region.

Contract (pure): a streaming decode runs every stage -- the embedding, every layer, the head -- on one region
(``scheduler.placement.plan_streaming``), which keeps only what stays on the wafer
(``decode.layout.stream_booking``: every layer's K/V, a double buffer of weight blocks, a scratch area).
:class:`WeightStore` is the off-wafer memory: it cuts each block into the region's cores' blocks once
(``decode.pack``), keeps them, and serves ``layer(i)``, ``head(k)`` (chunk k of the tied table with the final norm: the
head streams in ``head_chunks`` pieces, none larger on a core than a layer's block, so the double buffer is
sized by the largest layer) and ``rows(tokens)`` (only the embedding rows of the tokens cross); ``block`` serves a
:class:`StreamBlock` (layer i or head chunk k), in the order ``stream_order`` gives.
``streamed_logits`` runs the head chunk by chunk (a MeshGEMV per chunk). ``streamed_bytes`` is what a stage
run takes in over the wafer's ingress (the block's bytes in the storage dtype; the embedding rows of its
items), ``stream_cycles`` how long that takes at ``spec.ingress_bytes_per_s``. A block streams in while the
one before it computes (the double buffer), so a stage lasts the longer of its compute and its stream
(``stage_cycles``; the tiles book the difference as the op "stream"); ``head_parts`` is the closed form of
the chunked head and ``stream_step_cycles`` the one model of a streaming step: a micro-batch through every stage,
what the tiles book and what the planner and the estimator time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, total
from waferrt.core.dtypes import itemsize, to_f32
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .cost import head_gemv_parts, head_norm_parts, layer_decode_cost
from .decoding import Decoding
from .layout import head_chunk_entries, layer_layouts
from .net import net_of
from .pack import Chunks, pack_embed, pack_layer
from .shards import mesh_rmsnorm, norm_of, table_rows
from .stage import StageKind


def head_chunks(config: LlamaConfig, region: Region, dtype: str, head_groups: int = 1) -> list[tuple[int, int]]:
    """[j0, j1) ranges of every core row's vocabulary block (voc_r entries) that stream in as one chunk: as
    many entries as fit in a layer's block on a core (the final norm comes with the first), at least one."""
    voc_r, m = cdiv(config.vocab_size, region.h), head_chunk_entries(config, region, dtype, head_groups)
    return [(j, min(j + m, voc_r)) for j in range(0, voc_r, m)]


def streamed_bytes(config: LlamaConfig, kind: StageKind, dtype: str, items: int) -> int:
    """Bytes a stage run of `kind` takes in from off-wafer memory: a layer's weights, the tied table and the
    final norm (the head), or the embedding rows of its `items` tokens."""
    isz = itemsize(dtype)
    if kind is StageKind.LAYER:
        unit = layer_layouts(config, Region(0, 0, 1, 1), dtype)
        return sum(int(np.prod(lay.shape)) for lay in unit.values()) * isz
    if kind is StageKind.HEAD:
        return (config.vocab_size + 1) * config.dim * isz
    return items * config.dim * isz


def stream_cycles(spec: HardwareSpec, nbytes: int) -> float:
    """Cycles `nbytes` take to cross the wafer's ingress."""
    return nbytes * spec.clock_hz / spec.ingress_bytes_per_s


def stage_cycles(spec: HardwareSpec, compute: float, nbytes: int) -> float:
    """A streamed stage: its block came in while the stage before computed, so it lasts the longer of its
    compute and its stream."""
    return max(compute, stream_cycles(spec, nbytes))


def head_parts(spec: HardwareSpec, dec: Decoding, region: Region, batch: int = 1) -> list[tuple[str, str, Cost]]:
    """The final RMSNorm and the head chunk by chunk (streamed_logits), as the tiles book them."""
    out = head_norm_parts(spec, dec, region, batch)
    for j0, j1 in head_chunks(dec.config, region, dec.dtype, dec.head_groups):
        out += head_gemv_parts(spec, dec, region, batch, j1 - j0)
    return out


def stream_step_cycles(spec: HardwareSpec, dec: Decoding, region: Region, kv_tokens: int, batch: int) -> float:
    """A micro-batch of `batch` tokens (their requests holding `kv_tokens` positions) through every stage of
    a streaming region -- the embedding rows, every layer, the head -- each stage the longer of its compute
    and its block's stream (stage_cycles): what the tiles book, what the planner and the estimator time."""
    config = dec.config
    layer = layer_decode_cost(spec, dec, region, kv_tokens, batch).cycles
    head = total(c for _, _, c in head_parts(spec, dec, region, batch)).cycles
    return (stage_cycles(spec, 0.0, streamed_bytes(config, StageKind.EMBED, dec.dtype, batch))
            + config.n_layers * stage_cycles(spec, layer, streamed_bytes(config, StageKind.LAYER, dec.dtype, batch))
            + stage_cycles(spec, head, streamed_bytes(config, StageKind.HEAD, dec.dtype, batch)))


def streamed_logits(comm, coll, config: LlamaConfig, chunks, x: np.ndarray, dtype: str) -> np.ndarray:
    """Final RMSNorm and the tied head over `chunks` (an iterable of (table chunk (R*m, C*dim_c), final norm)
    in head_chunks order): x (B, C, dim_c) -> every core row's logits block (B, R, voc_r)."""
    out, h, net = [], None, net_of(coll)
    for table, norm in chunks:
        if h is None:
            h = mesh_rmsnorm(net, comm, x, to_f32(norm, dtype), norm_of(config))
        out.append(net.gemv(comm, to_f32(table, dtype), h))  # (B, R, m)
    return np.concatenate(out, axis=2)


@dataclass(frozen=True)
class StreamBlock:
    """A block WeightStore serves: layer `index`'s weights (kind LAYER) or the head's chunk `index` (HEAD)."""

    kind: StageKind
    index: int

    def __post_init__(self) -> None:
        if self.kind is StageKind.EMBED:
            raise ValueError("the embedding streams by rows (WeightStore.rows), not as a block: a StreamBlock is "
                             "StageKind.LAYER or StageKind.HEAD")


def stream_order(n_layers: int, head_count: int) -> list[StreamBlock]:
    """The blocks in the order a decode step streams them: layer 0 .. L-1, then the head's chunks."""
    return ([StreamBlock(StageKind.LAYER, i) for i in range(n_layers)]
            + [StreamBlock(StageKind.HEAD, k) for k in range(head_count)])


class WeightStore:
    """The model's weights off the wafer (MemoryX), cut for the streaming region once and served by block."""

    def __init__(self, config: LlamaConfig, region: Region, dtype: str, weights):
        self.config, self.region, self.dtype, self.weights = config, region, dtype, weights
        self.vocab = Chunks(config.vocab_size, region.h)
        self.chunks = head_chunks(config, region, dtype)
        self._layers: dict[int, dict] = {}
        self._table: dict | None = None
        self._head_table: dict | None = None  # an untied head's (a tied head's is _table)
        self._heads: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def head_count(self) -> int:
        """How many chunks the head streams in."""
        return len(self.chunks)

    def layer(self, i: int) -> dict[str, np.ndarray]:
        if i not in self._layers:
            self._layers[i] = pack_layer(self.config, self.weights.layers[i], self.region, self.dtype)
        return self._layers[i]

    def _packed(self) -> dict[str, np.ndarray]:
        if self._table is None:
            self._table = pack_embed(self.config, self.weights.embed, self.weights.final_norm, self.region, self.dtype)
        return self._table

    def _packed_head(self) -> dict[str, np.ndarray]:
        if self.weights.tied:
            return self._packed()
        if self._head_table is None:
            self._head_table = pack_embed(self.config, self.weights.head, self.weights.final_norm, self.region,
                                          self.dtype)
        return self._head_table

    def head(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk k of the head's table (the tied table, or an untied head's), (R*m, C*dim_c) as every core row's
        entries j0..j1, and the final norm (cut once, kept)."""
        if k not in self._heads:
            self._heads[k] = self._head(k)
        return self._heads[k]

    def _head(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        t = self._packed_head()
        voc_r = t["table"].shape[0] // self.region.h
        j0, j1 = self.chunks[k]
        rows = (np.arange(self.region.h)[:, None] * voc_r + np.arange(j0, j1)[None]).reshape(-1)
        return t["table"][rows], t["final_norm"]

    def block(self, key: StreamBlock):
        """layer(i) or head(k), as `key` names it."""
        return self.layer(key.index) if key.kind is StageKind.LAYER else self.head(key.index)

    def rows(self, tokens: np.ndarray) -> np.ndarray:
        """The embedding rows of `tokens` (B,) as float32 (B, C, dim_c), split over the region's columns."""
        tokens = np.asarray(tokens)
        rows = table_rows(self._packed()["table"], self.vocab, self.dtype, tokens)
        return rows.reshape(len(tokens), self.region.w, -1)
