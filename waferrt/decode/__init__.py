"""waferrt.decode: a Llama decoder on the mesh -- where its tensors sit in a region (layout), the weight
blocks (pack), the shift-based K/V cache (kvcache), a layer and the embedding/head run by their cores
(shards), the tile program of a decode step (program, setup) and its modelled cost (cost).

Contract: pure (no Ray, no sockets, no model files): it takes a LlamaConfig, float32 weights and regions,
and moves data between cores only through waferrt.fabric.
"""

from .kvcache import KVCapacityError, MeshKVCache
from .program import TileProgram
from .schedule import Item, StageRun
from .setup import DecodeSetup, PlacementError, pack_stage, stage_sram, stage_weights
from .shards import EmbedShard, LayerShard

__all__ = ["DecodeSetup", "Item", "EmbedShard", "KVCapacityError", "LayerShard", "MeshKVCache", "PlacementError",
           "StageRun", "TileProgram", "pack_stage", "stage_sram", "stage_weights"]
