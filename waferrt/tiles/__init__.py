"""waferrt.tiles: one tile's cores as a plain object -- what the runtime asks of a tile, with no Ray and no sockets.

Contract: pure (no Ray, no sockets). :class:`TileCores` holds a tile's SRAM book, its DSM blocks, its armed
faults and what died on it, runs SPMD kernels over its part of a region and hosts its stages of an LLM
decode (the TileProgram). Its links are any waferrt.fabric.links.Links: a LoopFabric's in one process
(waferrt.localtiles), ZmqLinks in a Ray tile actor (waferrt.actors.tile.Tile extends it with its sockets,
heartbeat, reports to the host and the decode loop's thread).
"""

from .cores import TileCores

__all__ = ["TileCores"]
