"""What the host records of each fault: when it fired, when and how it was found, how it was recovered.

Contract: a :class:`FaultLog` holds one :class:`FaultEvent` per fault armed (from a plan or injected one by
one), in order. The runtime marks them ``fired`` (the tile's report: the step and the time it fired),
``detected`` (by what: a checksum, a core's or link's failure in its region, a heartbeat, Ray's actor-death
error, a deadline) and ``recovered`` (what was done and what it would cost on the modelled wafer).
``table()`` prints them for a person; ``as_dicts()`` for ``--json``. Times are ``time.time()`` seconds.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import fault_dict


@dataclass
class FaultEvent:
    index: int
    fault: object
    step: int = -1  # the step it fired at (-1: it has not fired)
    fired_at: float | None = None
    detected_at: float | None = None
    detected_by: str = ""
    recovered_at: float | None = None
    action: str = ""  # what recovery did ("none needed: ...", "re-planned ...; replayed ...")
    modelled_s: float = 0.0  # the recovery's cost on the modelled wafer (weights in, tokens replayed)

    @property
    def kind(self) -> str:
        return self.fault.kind

    @property
    def where(self) -> str:
        return self.fault.where()

    @property
    def detected_after_s(self) -> float | None:
        if self.fired_at is None or self.detected_at is None:
            return None
        return max(0.0, self.detected_at - self.fired_at)

    @property
    def recovered_in_s(self) -> float | None:
        if self.detected_at is None or self.recovered_at is None:
            return None
        return max(0.0, self.recovered_at - self.detected_at)

    @property
    def outcome(self) -> str:
        if self.fired_at is None:
            return "did not fire"
        if self.recovered_at is not None:
            return "recovered"
        return "detected, not recovered" if self.detected_at is not None else "fired, not detected"

    def as_dict(self) -> dict:
        return {"index": self.index, "kind": self.kind, "where": self.where, "fault": fault_dict(self.fault),
                "step": self.step, "outcome": self.outcome, "detected_by": self.detected_by,
                "detected_after_s": self.detected_after_s, "recovered_in_s": self.recovered_in_s,
                "recovered_modelled_s": self.modelled_s, "action": self.action}


class FaultLog:
    def __init__(self, faults=()):
        self.events = [FaultEvent(i, f) for i, f in enumerate(faults)]

    def add(self, fault) -> int:
        self.events.append(FaultEvent(len(self.events), fault))
        return len(self.events) - 1

    def fired(self, index: int, step: int, at: float) -> FaultEvent:
        ev = self.events[index]
        if ev.fired_at is None:
            ev.step, ev.fired_at = step, at
        return ev

    def found(self, faults, at: float) -> list[FaultEvent]:
        """Faults nobody injected that a recovery found (a crash, a core dead since an earlier run): each a
        new event, fired when it was found (its true moment is unknown)."""
        events = [self.events[self.add(f)] for f in faults]
        for e in events:
            e.fired_at = at
        return events

    def pending(self) -> list[FaultEvent]:
        """Fired and not yet recovered."""
        return [e for e in self.events if e.fired_at is not None and e.recovered_at is None]

    def unfired(self) -> list[FaultEvent]:
        return [e for e in self.events if e.fired_at is None]

    def detected(self, events: list[FaultEvent], by: str, at: float) -> None:
        for e in events:
            if e.detected_at is None:
                e.detected_at, e.detected_by = at, by

    def recovered(self, events: list[FaultEvent], action: str, at: float, modelled_s: float = 0.0) -> None:
        for e in events:
            e.recovered_at, e.action, e.modelled_s = at, action, modelled_s

    def as_dicts(self) -> list[dict]:
        return [e.as_dict() for e in self.events]

    def table(self) -> str:
        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        lines = [f"{'#':>3} {'kind':<10}{'where':<38}{'step':>5} {'detected by':<31}{'after s':>8}"
                 f"{'recovered s':>12}{'modelled ms':>12}  action"]
        for e in self.events:
            lines.append(f"{e.index:>3} {e.kind:<10}{e.where[:37]:<38}{e.step if e.step >= 0 else '-':>5} "
                         f"{(e.detected_by or e.outcome)[:30]:<31}{secs(e.detected_after_s):>8}"
                         f"{secs(e.recovered_in_s):>12}{e.modelled_s * 1e3:>12.3f}  {e.action}")
        return "\n".join(lines)
