"""waferrt: an emulated wafer-scale processor (a 2D mesh of small cores) as a Ray runtime, running LLMs.

The floors, each a subpackage (docs/ARCHITECTURE.md is the map): ``waferrt.core`` (specs, mesh, layouts,
SRAM, cost), ``waferrt.fabric`` (links, collectives, kernels), ``waferrt.model`` (the Llama math; its
file readers behind it), ``waferrt.decode`` (the model on the mesh), ``waferrt.scheduler`` (planning),
``waferrt.serving`` (requests and batching), ``waferrt.actors`` (the only Ray/pyzmq code), and the joins
``waferrt.runtime`` (:class:`Wafer`), ``waferrt.llm`` (:class:`WaferLLM`) and ``waferrt.cli``.

``waferrt.Context`` is the kernel context (the ``ctx`` of every kernel; docs/PROGRAMMING.md).

The public API (what docs/PROGRAMMING.md and the examples use) is the names of ``waferrt`` and of the packages
``waferrt.faults``, ``waferrt.model``, ``waferrt.scheduler`` and ``waferrt.serving``; ``import waferrt`` is light:
``Context``, ``Wafer`` (with its ``Launch``) and ``WaferLLM`` are imported on first use, so the pure floors never
pull in Ray or pyzmq.
"""

from .core.cost import Cost
from .core.mesh import Coord, Dir, MeshSpec, Region, TileId
from .core.spec import HardwareSpec, spec_by_name

__all__ = ["Context", "Coord", "Cost", "Dir", "HardwareSpec", "Launch", "MeshSpec", "Region", "TileId", "Wafer",
           "WaferLLM", "spec_by_name"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Context":
        from .fabric.kernel import Context

        return Context
    if name in ("Wafer", "Launch"):
        from . import runtime

        return getattr(runtime, name)
    if name == "WaferLLM":
        from .llm import WaferLLM

        return WaferLLM
    raise AttributeError(f"module 'waferrt' has no attribute {name!r}")
