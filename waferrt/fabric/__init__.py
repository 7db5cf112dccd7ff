"""waferrt.fabric: how the cores of a region talk -- the Links protocol and its errors, the collectives
along a line of cores (LineComm), the kernel context (Context, exported as waferrt.Context), how a tile runs a
kernel (spmd), the errors of misuse, and the in-process fabric (LoopFabric, ``simulate``) that runs SPMD
kernels without Ray.

Contract: pure (no Ray, no sockets); the real fabric between Ray actors (waferrt.actors.fabric) implements
the same Links protocol.
"""

from .comm import LineComm
from .kernel import Context, NotNeighbourError
from .links import FabricError, FabricProtocolError, FabricTimeout, Links
from .loop import LoopFabric, simulate
from .misuse import BlockTooLarge, KernelMisuse, NeighbourFailed, NeighbourTimeout, NotSpmd, TileHung

__all__ = ["BlockTooLarge", "Context", "FabricError", "FabricProtocolError", "FabricTimeout", "KernelMisuse",
           "LineComm", "Links", "LoopFabric", "NeighbourFailed", "NeighbourTimeout", "NotNeighbourError", "NotSpmd",
           "TileHung", "simulate"]
