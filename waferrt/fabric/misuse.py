"""The errors of a kernel that breaks a rule of the programming model (docs/PROGRAMMING.md), each naming it.

Contract: :class:`KernelMisuse` and its kinds -- :class:`BlockTooLarge` (a message or temporary whose block
on one core is larger than a core's SRAM), :class:`NotSpmd` (the tiles of a region did not run the same
primitives in the same order: a collective or shift that not every tile joins, a message never received)
-- and :class:`NeighbourFailed` (a fabric error: a neighbour tile's kernel failed while this one waited for
it; its own error is the cause). :func:`from_neighbour` turns the protocol error a primitive gets when a
neighbour tile sent the end (or abort) of its kernel instead of data into the error that says so. Pure.
"""

from __future__ import annotations

import re

from .links import FabricError, FabricProtocolError

RULE = ("rule: every tile that holds cores of the region runs the same primitives in the same order (SPMD) -- "
        "a primitive under an `if` that differs between tiles, or a loop whose count does, breaks it")


class KernelMisuse(RuntimeError):
    """A kernel broke a rule of the programming model: the message names the rule and what to do instead (the
    exception's note and attributes add the kernel's line and the tile)."""


class BlockTooLarge(KernelMisuse):
    """A message or temporary whose block on one core is larger than a core's whole SRAM."""


class NotSpmd(KernelMisuse):
    """The tiles of a region did not run the same primitives in the same order."""


class NeighbourFailed(FabricError):
    """A neighbour tile's kernel failed (its own error is the cause) while this tile waited for it."""


def got_tag(e: FabricProtocolError) -> str | None:
    """The tag of the message that came instead of the one a recv waited for (None: another protocol error)."""
    m = re.search(r"expected message '[^']*' on its \w+ link, got '([^']*)'", str(e))
    return m.group(1) if m else None


def from_neighbour(error: FabricProtocolError, what: str, site) -> Exception:
    """What primitive `what` (at `site` of the kernel) raises when its recv got `error`."""
    other = got_tag(error) or ""
    if other.endswith(":abort"):
        return NeighbourFailed(f"a neighbour tile failed while {what} waited for it (its error is the cause)")
    if other.endswith(":end"):
        return NotSpmd(f"{what}{f' at {site}' if site else ''} waited for a neighbour tile of the region that ended "
                       f"the kernel without it: a collective or shift that not every tile joins; {RULE}")
    return error
