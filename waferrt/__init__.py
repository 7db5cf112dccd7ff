"""waferrt: an emulated wafer-scale processor (a 2D mesh of small cores) as a Ray runtime, running LLMs.

``import waferrt`` is light: the Ray-backed ``Wafer`` is imported on first use, so the pure modules
(waferrt.mesh, waferrt.model, waferrt.scheduler, ...) never pull in Ray or pyzmq.
"""

from .mesh import Coord, Dir, MeshSpec, Region, TileId
from .spec import HardwareSpec, spec_by_name

__all__ = ["Coord", "Dir", "HardwareSpec", "MeshSpec", "Region", "TileId", "Wafer", "spec_by_name"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Wafer":
        from .runtime import Wafer

        return Wafer
    raise AttributeError(f"module 'waferrt' has no attribute {name!r}")
