"""What every tile must know to run the decode, what each stage books in SRAM, and the weights it loads.

Contract: :class:`DecodeSetup` is a frozen value (model shape, mesh, the regions of the stages, K/V
reserve, how the collectives run, storage dtype), made from a scheduler Placement by
:meth:`DecodeSetup.from_placement`. Its stages are embed -> layer 0 -> ... -> layer L-1 -> head (a tied
head shares the embedding's region and table; an untied one, ``head``, has its own region holding its table
and the final norm, booked and packed as the embedding's; a table the head reads is held on the host in
float32, rounded to the storage dtype as it is cut, while an untied model's embedding table stays at the storage
dtype: it only gives rows); consecutive layers on one region (a strategy's group of
layers, scheduler.types.Strategy) are stacked there: their weight blocks and K/V on the same cores, run
one after another. With ``streaming`` the weights stay off-wafer (waferrt.decode.streaming) and one region
runs every stage. ``attention`` is dense or sparse:K (STAR, waferrt.decode.sparse) in every decode step and
the MeshGEMM prefill (waferrt.decode.sparse_prefill); sparse books its top-K lists (layout.topk_booking).
``stage_tiles`` says which tile runs each stage and
raises :class:`PlacementError` when a region spans several tiles, or an untied head's is not on the
embedding's tile (tokens are sampled where they enter). :func:`stage_sram` is what a stage
books in its cores' SRAM (from waferrt.decode.layout, the same sizes the planner budgets: every layer
books its weights and K/V, the first layer of a region also its scratch; a streaming region books every
layer's K/V, the double buffer and the scratch, and ``stage_weights`` yields nothing: the blocks stream in);
:func:`stage_weights` yields the float32 weights each stage needs (``weight_bytes``: their size) and
:func:`pack_stage` cuts them into its cores' blocks in the storage dtype (on the tile that hosts the
stage: the host ships each weight once). An MoE model's layers put their experts on blocks of their
regions by the mapping ``experts`` ("er" or "naive", waferrt.decode.moe_layout; waferrt.decode.moe packs and
runs them); MoE with weight streaming is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from waferrt.core.mesh import MeshSpec, Region, TileId
from waferrt.fabric.comm import KTREE_FAST, Collectives
from waferrt.model.config import LlamaConfig
from waferrt.model.sparse import DENSE, AttentionMode

from .decoding import Decoding
from .kvcache import KVCapacity
from .layout import booked_bytes, embed_booking, kv_booking, layer_booking, stream_booking, topk_booking
from .moe import pack_moe_layer
from .moe_layout import MAPPINGS
from .pack import pack_embed, pack_layer
from .stage import Stage, StageKind, chain


class PlacementError(ValueError):
    """The decode cannot run this placement (a region spans several tiles)."""


@dataclass(frozen=True)
class DecodeSetup:
    config: LlamaConfig
    mesh: MeshSpec
    layers: tuple[Region, ...]
    embed: Region
    kv_tokens: int  # per request, per layer
    slots: int  # requests in flight at most
    collectives: Collectives = KTREE_FAST
    dtype: str = "float32"  # how weights and K/V are stored in the cores (computed in float32)
    streaming: bool = False  # the weights stream in from off-wafer memory at each stage's turn
    prefill: bool = False  # prompts go through the layers by MeshGEMM, in chunks of 512 (waferrt.decode.prefill)
    experts: str = "er"  # where an MoE layer's experts sit in its region (waferrt.decode.moe_layout.MAPPINGS)
    balance: int = 0  # NI-Balancer: micro-batches between an MoE layer's looks at its routing histogram (0: off)
    attention: AttentionMode = DENSE  # the decode's attention: dense, or STAR's sparse:K (waferrt.decode.sparse)
    head: Region | None = None  # an untied output head's region (None: tied, the head runs on `embed`)

    def __post_init__(self) -> None:
        if self.experts not in MAPPINGS:
            raise ValueError(f"expert mapping {self.experts!r} is not one of {', '.join(MAPPINGS)}")
        if self.config.moe and self.streaming:
            raise PlacementError("a mixture of experts does not stream its weights yet: plan it on the wafer "
                                 "(without --streaming)")
        if self.config.moe and self.prefill:
            raise PlacementError("a mixture of experts has no MeshGEMM prefill yet: decode its prompts token "
                                 "by token (without --prefill)")
        if self.streaming and self.prefill:
            raise PlacementError("weight streaming has no MeshGEMM prefill (its one region holds no layer's "
                                 "weights to multiply with): leave out --prefill, or --streaming")

    @classmethod
    def from_placement(cls, placement, collectives: Collectives = KTREE_FAST, prefill: bool = False
                       ) -> DecodeSetup:
        """What the tiles need to know of a scheduler Placement to run its decode (`prefill`: prompts by
        MeshGEMM; refused, as for an MoE, for a streaming placement, which has no weights on the wafer)."""
        p = placement
        return cls(p.config, p.mesh, p.layers, p.embed, p.kv_tokens, p.kv.requests, collectives, p.dtype,
                   p.streaming, prefill, p.experts, p.balance, head=p.head)

    @cached_property
    def decoding(self) -> Decoding:
        """What the decode's closed forms (decode.cost) need of this setup: model, dtype, collectives, the
        expert mapping."""
        return Decoding(self.config, self.dtype, self.collectives, experts=self.experts, attention=self.attention)

    @property
    def kv(self) -> KVCapacity:
        """What every layer region's K/V caches hold: `slots` requests of `kv_tokens` positions."""
        return KVCapacity(self.slots, self.kv_tokens)

    def stages(self) -> tuple[Stage, ...]:
        """The stages in the order an item passes them (a tied head on the embedding's region)."""
        return chain(self.embed, self.layers, self.embed if self.head is None else self.head)

    def stage_tiles(self) -> tuple[TileId, ...]:
        """The tile that runs each stage."""
        out = []
        for stage in self.stages():
            tiles = self.mesh.tiles_of(stage.region)
            if len(tiles) != 1:
                what = stage.name if stage.kind is StageKind.LAYER else f"the {stage.name}"
                raise PlacementError(
                    f"{what} has region {stage.region}, which spans {len(tiles)} tiles of {self.mesh.tile_w}x"
                    f"{self.mesh.tile_h} cores; the decode runs every region inside one tile. Choose a "
                    "tile size the scheduler can fill with whole regions (e.g. a multiple of the layer region)")
            out.append(tiles[0])
        if out[-1] != out[0]:
            raise PlacementError(
                f"the head's region {self.stages()[-1].region} is on tile {out[-1]}, the embedding's on {out[0]}: the "
                "decode samples each token where it enters (the embedding's tile), so an untied head's region must "
                "lie in the embedding's tile. Choose a tile that holds both tables (the planner puts the head "
                "beside the embedding when the tile has room)")
        return tuple(out)


def stage_sram(setup: DecodeSetup, s: int) -> dict[str, tuple[Region, np.ndarray]]:
    """What stage s keeps in its cores' SRAM: tensor name -> (region, bytes per core (rows, cols)). The
    stages of one region add up to what the planner budgets for it (layer_booking of its layers)."""
    stages = setup.stages()
    stage = stages[s]
    region, layer = stage.region, stage.layer
    if setup.streaming:
        return _stream_sram(setup, stage)
    if stage.kind is StageKind.LAYER:
        booked = booked_bytes(layer_booking(setup.config, region, setup.kv_tokens, setup.slots, setup.dtype)
                              | topk_booking(setup.config, region, setup.kv_tokens, setup.attention))
        if stages[s - 1].region == region:  # stacked on the layer before it: the region's scratch (and top-K) is booked
            del booked["scratch"]
            booked.pop("topk", None)
        return {f"layer{layer}.{name}": (region, nbytes) for name, nbytes in booked.items()}
    if stage.kind is StageKind.EMBED or setup.head is not None:  # the embedding's table, or an untied head's own
        booked = booked_bytes(embed_booking(setup.config, region, setup.dtype))
        return {f"{stage.kind.value}.{name}": (region, nbytes) for name, nbytes in booked.items()}
    return {}  # a tied head uses the embedding's table and scratch


def _stream_sram(st: DecodeSetup, stage: Stage) -> dict[str, tuple[Region, np.ndarray]]:
    """A streaming region's booking (stream_booking) shared out: each layer its K/V, the embedding stage the
    double buffer and the scratch."""
    region = stage.region
    booked = booked_bytes(stream_booking(st.config, region, st.kv_tokens, st.slots, st.dtype)
                          | topk_booking(st.config, region, st.kv_tokens, st.attention))
    if stage.kind is StageKind.LAYER:
        kv = kv_booking(st.config, region, st.kv_tokens, st.slots, st.dtype)
        return {f"layer{stage.layer}.kv": (region, booked_bytes({"kv": (kv,)})["kv"])}
    if stage.kind is StageKind.EMBED:
        return {f"stream.{name}": (region, booked[name]) for name in ("buffer", "scratch", "topk") if name in booked}
    return {}


def stage_weights(setup: DecodeSetup, weights):
    """(stage index, the model's float32 weights of that stage) for every stage that holds weights: a
    LayerWeights for a layer, (embedding table, final norm) for the embedding (a tied head shares them),
    (head table, final norm) for an untied head; none when the weights stream in."""
    if setup.streaming:
        return
    for s, stage in enumerate(setup.stages()):
        if stage.kind is StageKind.LAYER:
            yield s, weights.layers[stage.layer]
        elif stage.kind is StageKind.EMBED:
            yield s, (weights.embed, weights.final_norm)
        elif setup.head is not None:
            yield s, (weights.head, weights.final_norm)


def weight_bytes(raw) -> int:
    """Bytes of what stage_weights gave for a stage (the float32 weights the host sends it)."""
    arrays = raw if isinstance(raw, tuple) else raw.arrays().values()
    return sum(int(np.asarray(a).nbytes) for a in arrays)


def pack_stage(setup: DecodeSetup, s: int, raw) -> dict:
    """Stage s's weight blocks in the storage dtype, from what stage_weights gave for it."""
    stage = setup.stages()[s]
    region = stage.region
    if stage.kind is StageKind.LAYER and setup.config.moe:
        return pack_moe_layer(setup.config, raw, region, setup.experts, setup.dtype)
    if stage.kind is StageKind.LAYER:
        return pack_layer(setup.config, raw, region, setup.dtype)
    # a table the head's GEMV reads: held widened (pack_embed)
    head = stage.kind is StageKind.HEAD or setup.head is None
    return pack_embed(setup.config, raw[0], raw[1], region, setup.dtype, widened=head)
