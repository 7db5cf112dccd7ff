"""Fault injection: what can fail on a wafer (as data), how a tile carries it out, and the errors it causes.

``model`` holds the six fault kinds, their triggers and the seeded :class:`FaultPlan`; ``state`` a tile's
armed faults and what is dead on it; ``wire`` the payload checksum and the bit flips; ``errors`` what a
fault looks like when it is found; ``events`` what the host records of each fault. Pure: no Ray, no sockets.
"""

from .errors import CoreFailed, FaultError, FaultStop, LinkFailed, NoRoom, PayloadCorrupt, Unrecoverable
from .model import (
    KINDS,
    CoreFailure,
    Corrupt,
    FaultPlan,
    LinkFailure,
    NodeLoss,
    Straggler,
    Targets,
    TileCrash,
    Trigger,
)

__all__ = ["KINDS", "CoreFailed", "CoreFailure", "Corrupt", "FaultError", "FaultPlan", "FaultStop", "LinkFailed",
           "LinkFailure", "NodeLoss", "NoRoom", "PayloadCorrupt", "Straggler", "Targets", "TileCrash", "Trigger",
           "Unrecoverable"]
