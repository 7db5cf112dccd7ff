"""What the host records of each fault: when it fired, when and how it was found, how it was recovered.

Contract: a :class:`FaultLog` (``wafer.session.log``) holds one :class:`FaultEvent` per fault armed (from a
plan or injected one by one), in order. Reading it (docs/PROGRAMMING.md, "Fault tests"):

- ``log.events``: every event; ``log.fired()``, ``log.detected()``, ``log.recovered()``, ``log.pending()``
  (fired, not recovered), ``log.unfired()``: lists of events; ``log.of_kind("core")``; ``log.counts()``.
- an event: ``kind``, ``where``, ``fault``, ``step`` (the step it fired at), ``outcome`` ("did not fire",
  "fired, not detected", "detected, not recovered", "recovered"), ``detected_by``, ``action``,
  ``modelled_s``; its times are measured from when the fault FIRED (not when it was armed):
  ``detected_after_s``, ``recovered_after_s`` (and ``recovered_in_s``, from its detection); ``armed_at``,
  ``fired_at``, ``detected_at``, ``recovered_at`` are the ``time.time()`` seconds themselves.
- ``log.table()`` for a person, ``log.as_dicts()`` for ``--json``.

The runtime records with ``mark_fired`` (the tile's report: the step and the time it fired),
``mark_detected`` (by what: a checksum, a core's or link's failure in its region, a heartbeat, Ray's
actor-death error, a deadline) and ``mark_recovered`` (what was done and what it would cost on the modelled
wafer). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import FaultKind, fault_dict


@dataclass
class FaultEvent:
    """What became of one fault (see the module's contract)."""

    index: int
    fault: object
    armed_at: float | None = None  # when it was armed (time.time())
    step: int = -1  # the step it fired at (-1: it has not fired)
    fired_at: float | None = None
    detected_at: float | None = None
    detected_by: str = ""
    recovered_at: float | None = None
    action: str = ""  # what recovery did ("none needed: ...", "re-planned ...; replayed ...")
    modelled_s: float = 0.0  # the recovery's cost on the modelled wafer (weights in, tokens replayed)

    @property
    def kind(self) -> FaultKind:
        return self.fault.kind

    @property
    def where(self) -> str:
        return self.fault.where()

    @property
    def detected_after_s(self) -> float | None:
        """Seconds from when it fired to its detection (None: not both)."""
        if self.fired_at is None or self.detected_at is None:
            return None
        return max(0.0, self.detected_at - self.fired_at)

    @property
    def recovered_after_s(self) -> float | None:
        """Seconds from when it fired to when it was recovered (None: not both)."""
        if self.fired_at is None or self.recovered_at is None:
            return None
        return max(0.0, self.recovered_at - self.fired_at)

    @property
    def recovered_in_s(self) -> float | None:
        """Seconds from its detection to its recovery (None: not both)."""
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
        return {"index": self.index, "kind": self.kind.value, "where": self.where, "fault": fault_dict(self.fault),
                "step": self.step, "outcome": self.outcome, "detected_by": self.detected_by,
                "detected_after_s": self.detected_after_s, "recovered_after_s": self.recovered_after_s,
                "recovered_in_s": self.recovered_in_s,
                "recovered_modelled_s": self.modelled_s, "action": self.action}


class FaultLog:
    """The events of a wafer's faults: queries (lists, counts) and the runtime's recorders (``mark_*``)."""

    def __init__(self, faults=(), at: float | None = None):
        self.events = [FaultEvent(i, f, at) for i, f in enumerate(faults)]

    # -- queries --------------------------------------------------------------------------------------
    def fired(self) -> list[FaultEvent]:
        """The events of the faults that fired."""
        return [e for e in self.events if e.fired_at is not None]

    def detected(self) -> list[FaultEvent]:
        return [e for e in self.events if e.detected_at is not None]

    def recovered(self) -> list[FaultEvent]:
        return [e for e in self.events if e.recovered_at is not None]

    def pending(self) -> list[FaultEvent]:
        """Fired and not yet recovered."""
        return [e for e in self.events if e.fired_at is not None and e.recovered_at is None]

    def unfired(self) -> list[FaultEvent]:
        return [e for e in self.events if e.fired_at is None]

    def of_kind(self, kind: FaultKind | str) -> list[FaultEvent]:
        """The events of one kind of fault (a FaultKind, or its word: "core", "link", "corrupt", ...)."""
        kind = FaultKind(kind)
        return [e for e in self.events if e.kind is kind]

    def counts(self) -> dict[str, int]:
        """How many faults were injected, fired, detected and recovered."""
        return {"injected": len(self.events), "fired": len(self.fired()), "detected": len(self.detected()),
                "recovered": len(self.recovered())}

    # -- the runtime's recorders ----------------------------------------------------------------------
    def add(self, fault, at: float | None = None) -> int:
        """A fault armed at `at`: its index."""
        self.events.append(FaultEvent(len(self.events), fault, at))
        return len(self.events) - 1

    def mark_fired(self, index: int, step: int, at: float) -> FaultEvent:
        ev = self.events[index]
        if ev.fired_at is None:
            ev.step, ev.fired_at = step, at
        return ev

    def found(self, faults, at: float) -> list[FaultEvent]:
        """Faults nobody injected that a recovery found (a crash, a core dead since an earlier run): each a
        new event, fired when it was found (its true moment is unknown)."""
        events = [self.events[self.add(f, at)] for f in faults]
        for e in events:
            e.fired_at = at
        return events

    def mark_detected(self, events: list[FaultEvent], by: str, at: float) -> None:
        for e in events:
            if e.detected_at is None:
                e.detected_at, e.detected_by = at, by

    def mark_recovered(self, events: list[FaultEvent], action: str, at: float, modelled_s: float = 0.0) -> None:
        for e in events:
            e.recovered_at, e.action, e.modelled_s = at, action, modelled_s

    # -- for people and for --json --------------------------------------------------------------------
    def as_dicts(self) -> list[dict]:
        return [e.as_dict() for e in self.events]

    def table(self) -> str:
        """One line per fault; "detected +s" and "recovered +s" count from when it fired."""
        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        lines = [f"{'#':>3} {'kind':<10}{'where':<38}{'step':>5} {'detected by':<31}{'detected +s':>12}"
                 f"{'recovered +s':>13}{'modelled ms':>12}  action"]
        for e in self.events:
            lines.append(f"{e.index:>3} {e.kind:<10}{e.where[:37]:<38}{e.step if e.step >= 0 else '-':>5} "
                         f"{(e.detected_by or e.outcome)[:30]:<31}{secs(e.detected_after_s):>12}"
                         f"{secs(e.recovered_after_s):>13}{e.modelled_s * 1e3:>12.3f}  {e.action}")
        return "\n".join(lines)
