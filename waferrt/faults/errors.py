"""What a fault looks like when it is found: errors that name what died, where, and what was lost.

Contract: :class:`FaultError` is the base of every error a fault causes. :class:`CoreFailed` names the dead
core and what its SRAM held (DSM blocks, a layer's weights and K/V); :class:`LinkFailed` names both ends of
the dead link; :class:`PayloadCorrupt` is a payload whose checksum did not match on receipt (it is never
used). :class:`Unrecoverable` ends a run that cannot be repaired: it says what died and what would be
needed. :class:`FaultStop` is the first fault under the fail-fast policy. All pickle with their fields
(they cross Ray). Pure.
"""

from __future__ import annotations

from waferrt.core.mesh import Coord


class FaultError(RuntimeError):
    """A fault (injected or real) hit the run."""


class CoreFailed(FaultError):
    """A core is dead: it computes, answers and forwards nothing, and its SRAM is gone."""

    def __init__(self, core: Coord, lost: tuple[str, ...] = (), where: str = ""):
        self.core, self.lost, self.where = core, tuple(lost), where
        held = f"; its SRAM held {', '.join(self.lost)} (lost)" if self.lost else "; it held nothing"
        super().__init__(f"core {core} is dead{f' ({where})' if where else ''}{held}")

    def __reduce__(self):
        return type(self), (self.core, self.lost, self.where)


class LinkFailed(FaultError):
    """The link between two neighbouring cores is dead, both ways."""

    def __init__(self, a: Coord, b: Coord, where: str = ""):
        self.a, self.b, self.where = a, b, where
        self.core = a  # the end the message starts from
        super().__init__(f"the link {a}-{b} is dead{f' ({where})' if where else ''}: nothing crosses it")

    def __reduce__(self):
        return type(self), (self.a, self.b, self.where)


class PayloadCorrupt(FaultError):
    """A payload arrived whose checksum does not match: it was dropped, never used. Names the link: the tile
    that received it, the neighbour tile that sent it and the side it came in on."""

    def __init__(self, receiver, sender, side: str, what: str = "a message"):
        self.receiver, self.sender, self.side, self.what = receiver, sender, side, what
        super().__init__(f"{receiver}: {what} on the link from {sender} (its {side} side) failed its checksum: its "
                         "payload was corrupted on the way and was not used")

    def __reduce__(self):
        return type(self), (self.receiver, self.sender, self.side, self.what)


class Unrecoverable(FaultError):
    """The run cannot be repaired: what died and what would be needed."""


class NoRoom(Unrecoverable):
    """More cores and links died than the wafer has room to re-plan the model around."""


class FaultStop(FaultError):
    """Under the fail-fast policy, the first fault ends the run."""
