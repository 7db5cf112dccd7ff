"""A tile's side of fault injection: the faults armed on it, when they fire, and what is dead on it.

Contract: a :class:`FaultState` belongs to one tile. ``arm(fault, index, seed)`` arms a fault of
waferrt.faults.model that concerns the tile (the host sends each fault to the tiles it touches);
``tick(step)`` counts the steps the tile runs (`step`: the decode's micro-batch number or the kernel
command's number; ``None``: no new step, only timers) and fires the armed faults whose trigger holds: a
``Trigger(step=N)`` fires at the N-th step the tile runs after the fault was armed. A fault that fires is
applied: a dead core or link joins ``dead_cores`` / ``dead_links``, a straggler adds its ``delay`` per
stage, a Corrupt fault fires with the next message over its link (its flips), a TileCrash calls the
``crash`` hook (the actor's ``os._exit``). Every fault that fires is handed to the ``on_fire`` hook as a
:class:`Fired` record (the actor reports it to the host). ``on_send(d)`` is the fabric's hook for each
message it sends over its link `d`: it returns the bits to flip in that message (None: send it as it is).
``hit(region)`` is the first dead core or link inside `region` (the code that would use it raises CoreFailed
/ LinkFailed); ``map()`` is what is dead here as a waferrt.faults.faultmap.FaultMap. A fault fires once.
Pure: no Ray, no sockets."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from waferrt.core.mesh import Coord, Dir, Region, TileId

from .faultmap import FaultMap
from .model import CoreFailure, Corrupt, LinkFailure, NodeLoss, Straggler, TileCrash, link_dir


@dataclass(frozen=True)
class Fired:
    index: int  # the fault's place in its plan (or in the order it was injected)
    fault: object
    tile: TileId
    step: int  # the step at which it fired
    at: float  # time.time() when it fired


@dataclass
class _Armed:
    index: int
    fault: object
    since: float  # time.monotonic() when armed
    rng: random.Random  # the fault's own draws (rate triggers, which bits flip)
    sent: int = 0  # messages sent over the fault's link since it was armed (Corrupt)
    due: bool = False  # a Corrupt that fired: its next message gets the flips
    steps: int = 0  # steps the tile has run since the fault was armed
    last: int | None = None  # the step it saw last


class FaultState:
    def __init__(self, tile: TileId, region: Region, on_fire: Callable[[Fired], None] | None = None,
                 crash: Callable[[], None] | None = None):
        self.tile, self.region = tile, region
        self.on_fire, self.crash = on_fire, crash
        self.armed: list[_Armed] = []
        self.dead_cores: set[Coord] = set()
        self.dead_links: set[frozenset[Coord]] = set()
        self.delay = 0.0  # seconds added to every stage (a straggling tile)
        self.slow_cores: dict[Coord, float] = {}  # straggling cores: seconds added to the stages whose region holds one
        self.fired: list[Fired] = []

    def arm(self, fault, index: int, seed: int = 0) -> None:
        if isinstance(fault, NodeLoss):
            raise ValueError("a NodeLoss is carried out by the host (it removes a Ray node), not by a tile")
        self.armed.append(_Armed(index, fault, time.monotonic(), random.Random(f"{seed}:{index}")))

    def disarm(self) -> None:
        """Forget the faults that have not fired, and the records of those that did: the session that armed
        them is over (what has died stays dead)."""
        self.armed = [a for a in self.armed if a.due]
        self.fired = []

    @property
    def quiet(self) -> bool:
        """Nothing armed, nothing dead, nobody slow: the hot paths skip their checks."""
        return not (self.armed or self.dead_cores or self.dead_links or self.delay or self.slow_cores)

    def delay_in(self, region: Region) -> float:
        """The seconds a straggler adds to a stage (or kernel command) on `region`: the tile's own delay, and the
        delay of every slow core the region holds (its collectives wait for that core)."""
        if not self.slow_cores:  # the usual case, once per stage: no scan
            return self.delay
        return self.delay + sum(d for c, d in self.slow_cores.items() if region.contains(c))

    def tick(self, step: int | None) -> list[Fired]:
        if not self.armed:
            return []
        now, out = time.monotonic(), []
        for a in list(self.armed):
            new = step is not None and step != a.last  # a step this tile had not seen (the same micro-batch
            if new:                                    # passes a tile once per segment it runs there)
                a.steps, a.last = a.steps + 1, step
            if not a.due and self._holds(a, new, now) and (rec := self._fire(a)) is not None:
                out.append(rec)
        return out

    def _holds(self, a: _Armed, new_step: bool, now: float) -> bool:
        w = a.fault.when
        if not (w.step or w.message or w.seconds or w.rate):
            return True
        if w.step and a.steps >= w.step:
            return True
        if w.seconds and now - a.since >= w.seconds:
            return True
        return bool(w.rate) and new_step and a.rng.random() < w.rate

    def _fire(self, a: _Armed) -> Fired | None:
        f = a.fault
        if isinstance(f, Corrupt) and not a.due:
            a.due = True  # it flips the bits of the next message over its link: it fires then
            return None
        self.armed.remove(a)
        rec = Fired(a.index, f, self.tile, a.steps, time.time())
        self.fired.append(rec)
        if isinstance(f, CoreFailure):
            self.dead_cores.add(f.core)
        elif isinstance(f, LinkFailure):
            self.dead_links.add(frozenset((f.a, f.b)))
        elif isinstance(f, Straggler) and f.core is not None:
            self.slow_cores[f.core] = self.slow_cores.get(f.core, 0.0) + f.delay
        elif isinstance(f, Straggler):
            self.delay += f.delay
        if self.on_fire is not None:
            self.on_fire(rec)
        if isinstance(f, TileCrash) and self.crash is not None:
            self.crash()
        return rec

    def on_send(self, d: Dir) -> tuple[int, random.Random] | None:
        """For the message about to leave over link d: (bits to flip, the draws that place them), or None."""
        for a in self.armed:
            f = a.fault
            if not isinstance(f, Corrupt) or link_dir(f.a, f.b) != d:
                continue
            a.sent += 1
            if not a.due and f.when.message and a.sent >= f.when.message:
                a.due = True
            if a.due:
                self._fire(a)
                return f.bits, a.rng
        return None

    def map(self) -> FaultMap:
        """What is dead on this tile, as a fault map."""
        return FaultMap(frozenset(self.dead_cores), frozenset(self.dead_links))

    def hit(self, region: Region) -> CoreFailure | LinkFailure | None:
        """The first dead core, else dead link, inside `region` (None when it is whole)."""
        m = self.map()
        return m.hit(m.in_region(region), m.region_links(region, "x") + m.region_links(region, "y"))
