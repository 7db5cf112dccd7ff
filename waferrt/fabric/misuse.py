"""The errors of a kernel that breaks a rule of the programming model (docs/PROGRAMMING.md), each naming it.

Contract: :class:`KernelMisuse` and its kinds -- :class:`BlockTooLarge` (a message or temporary whose block
on one core is larger than a core's SRAM), :class:`NotSpmd` (the tiles of a region did not run the same
primitives in the same order: a collective or shift that not every tile joins, a message never received),
:class:`TileHung` (a tile did not finish its kernel within the deadline after its neighbours stopped waiting
for it) -- and the fabric errors a primitive raises: :class:`NeighbourFailed` (a neighbour tile's kernel
failed while this one waited for it; its own error is the cause) and :class:`NeighbourTimeout` (a neighbour
did not come within ``Launch.timeout``: the slow tile is blamed, as ``blame``). :func:`from_neighbour` turns
what a primitive's receive got instead of data -- a neighbour's end of kernel (with the primitives it ran),
its abort, another primitive's message, nothing at all -- into the error that says which tile did what.
``blame`` (a TileId), where set, is the tile at fault when it is not the one that raised. Pure.
"""

from __future__ import annotations

from waferrt.core.mesh import Dir, TileId

from .links import FabricError, FabricTimeout, TagMismatch

RULE = ("rule: every tile that holds cores of the region runs the same primitives in the same order (SPMD) -- "
        "a primitive under an `if` that differs between tiles, or a loop whose count does, breaks it")


class KernelMisuse(RuntimeError):
    """A kernel broke a rule of the programming model: the message names the rule and what to do instead (the
    exception's note and attributes add the kernel's line and the tile)."""


class BlockTooLarge(KernelMisuse):
    """A message or temporary whose block on one core is larger than what the core's SRAM has free."""


class NotSpmd(KernelMisuse):
    """The tiles of a region did not run the same primitives in the same order. ``site``, where known, is the
    kernel's line of the primitive where they parted."""

    site = None


class TileHung(KernelMisuse):
    """A tile did not finish its kernel within the deadline after its neighbours stopped waiting for it (a loop
    or a wait in the kernel's own code that never ends); ``blame`` names it."""


class NeighbourFailed(FabricError):
    """A neighbour tile's kernel failed (its own error is the cause) while this tile waited for it."""


class NeighbourTimeout(FabricTimeout):
    """A neighbour tile did not come within ``Launch.timeout`` while this tile waited for it at a primitive:
    ``blame`` is that neighbour (slow, stuck, or never running the primitive)."""


def peer_of(tile, side: Dir) -> TileId | str:
    """The neighbour tile of `tile` (a TileId) on `side`, for messages ("tile" where `tile` is not a TileId)."""
    tx, ty = getattr(tile, "tx", None), getattr(tile, "ty", None)
    return "tile" if tx is None else TileId(tx + side.value[0], ty + side.value[1])


def decode_calls(arrays: list) -> list[tuple[str, str]]:
    """The primitives a tile ran (with their lines), from the payload of its end-of-kernel message."""
    if not arrays:
        return []
    return [tuple(c.split("\t")) for c in bytes(arrays[0]).decode().split("\n") if c]


def from_neighbour(error: FabricError, what: str, site, ran: list[tuple[str, str]]) -> Exception:
    """What primitive `what` (at `site` of the kernel; `ran`: the primitives this tile ran, `what` last)
    raises when its receive got `error` instead of its data."""
    at = f" at {site}" if site else ""
    if isinstance(error, FabricTimeout) and error.side is not None:
        peer = peer_of(error.tile, error.side)
        e = NeighbourTimeout(
            f"{peer} was too slow: {error.tile} waited for it at {what}{at} and it did not come ({error}). {peer} is "
            "slower than the tiles' deadline, stuck in the kernel's own code, or never runs this primitive; if it "
            "is only slow, give the tiles longer: Wafer(..., launch=waferrt.Launch(timeout=...))", error.tile,
            error.side)
        e.blame = peer
        return e
    if not isinstance(error, TagMismatch):
        return error
    peer = peer_of(error.tile, error.side)
    if error.got.endswith(":abort"):
        return NeighbourFailed(f"{error.tile}: its {error.side.name} neighbour {peer} failed while {what}{at} waited "
                               "for it (its own error is the cause)")
    if error.got.endswith(":end"):
        theirs, i = decode_calls(error.arrays), len(ran) - 1
        did = (f"ran {theirs[i][0]} at {theirs[i][1]} as its primitive {i + 1} instead" if i < len(theirs) else
               f"ended the kernel after {len(theirs)} primitive(s), without it")
        return NotSpmd(f"{error.tile} ran {what}{at} as its primitive {i + 1}, but its {error.side.name} neighbour "
                       f"{peer} {did}; {RULE}")
    return NotSpmd(f"{error.tile} ran {what}{at}, but its {error.side.name} neighbour {peer} sent a message of "
                   f"another primitive ({error.got!r}, along {error.got.rpartition(':')[2][:1] or '?'}); {RULE}")
