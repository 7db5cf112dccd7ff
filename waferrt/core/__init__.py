"""waferrt.core: the wafer's physics as pure values -- hardware specs, mesh geometry, DSM layouts, storage
dtypes, SRAM books, and the cost model of the primitives with the ledger they book into.

Contract: no Ray, no sockets, no model code (nothing here knows what a Llama is). Every floor above
(fabric, model, decode, scheduler, serving, actors, runtime) builds on these modules.
"""

from .cost import Cost
from .mesh import Coord, Dir, Extent, MeshSpec, Region, TileId
from .spec import PRESETS, HardwareSpec, spec_by_name

__all__ = ["PRESETS", "Coord", "Cost", "Dir", "Extent", "HardwareSpec", "MeshSpec", "Region", "TileId", "spec_by_name"]
