"""The cost ledger: where the emulated primitives book what they would cost on the modelled wafer.

Contract: a :class:`Ledger` collects :class:`~waferrt.cost.Cost` records by primitive name. A primitive
opens ``with ledger.op("allreduce.ktree"):``; every routed message inside books one routing stage with
``ledger.message(...)`` (critical-path hops, messages, link bytes, cycles), and ``with ledger.concurrent():``
folds several messages that travel at once into one stage. Only the outermost op is booked under its name,
so a MeshGEMV's allreduce counts as part of the GEMV. Ledgers of several tiles that ran the same SPMD
program merge with :func:`merge_parallel`: critical-path figures take the max, traffic adds up.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

from .cost import Cost, message_cycles
from .spec import HardwareSpec


class Ledger:
    def __init__(self, spec: HardwareSpec):
        self.spec = spec
        self.by_op: dict[str, Cost] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[tuple[str, Cost]] = []
        self._group: list[Cost] | None = None

    @contextmanager
    def op(self, name: str):
        self._stack.append((name, Cost()))
        try:
            yield
        finally:
            name, cost = self._stack.pop()
            if self._stack:
                outer_name, outer = self._stack[-1]
                self._stack[-1] = (outer_name, outer + cost)
            else:
                self.by_op[name] = self.by_op.get(name, Cost()) + cost
                self.calls[name] = self.calls.get(name, 0) + 1

    def _book(self, cost: Cost) -> None:
        if not self._stack:
            raise RuntimeError("a message was booked outside a primitive; wrap it in ledger.op(name)")
        name, acc = self._stack[-1]
        self._stack[-1] = (name, acc + cost)

    def message(self, hops: int, nbytes: float, messages: int, link_bytes: float | None = None) -> None:
        """One routing stage: `messages` messages of `nbytes` each travel `hops` hops (a multicast passes
        each link once: give its `link_bytes`)."""
        if link_bytes is None:
            link_bytes = messages * nbytes * hops
        cost = Cost(hops=hops, stages=1, link_bytes=int(round(link_bytes)), messages=messages,
                    cycles=message_cycles(self.spec, hops, 1, nbytes))
        if self._group is not None:
            self._group.append(cost)
        else:
            self._book(cost)

    @contextmanager
    def concurrent(self):
        """Messages booked inside travel at the same time: one stage, the longest one's latency."""
        outer, self._group = self._group, []
        try:
            yield
        finally:
            group, self._group = self._group, outer
            if group:
                longest = max(group, key=lambda c: c.cycles)
                merged = replace(longest, link_bytes=sum(c.link_bytes for c in group),
                                 messages=sum(c.messages for c in group))
                if self._group is not None:
                    self._group.append(merged)
                else:
                    self._book(merged)

    def compute(self, flops: int) -> None:
        """`flops` on the busiest core of the primitive."""
        self._book(Cost(flops=int(flops), cycles=flops / self.spec.flops_per_cycle))

    def total(self) -> Cost:
        out = Cost()
        for c in self.by_op.values():
            out = out + c
        return out

    def snapshot(self) -> dict:
        return {"ops": {k: v.as_dict() for k, v in self.by_op.items()}, "calls": dict(self.calls)}

    def clear(self) -> None:
        self.by_op.clear()
        self.calls.clear()


def merge_parallel(costs: list[Cost]) -> Cost:
    """Tiles that ran the same program side by side: critical path = max, traffic = sum."""
    if not costs:
        return Cost()
    return Cost(hops=max(c.hops for c in costs), stages=max(c.stages for c in costs),
                link_bytes=sum(c.link_bytes for c in costs), messages=sum(c.messages for c in costs),
                flops=max(c.flops for c in costs), cycles=max(c.cycles for c in costs))


def merge_snapshots(snaps: list[dict]) -> dict[str, Cost]:
    """Per-op costs of several tiles' ledger snapshots, merged with merge_parallel."""
    names = sorted({k for s in snaps for k in s["ops"]})
    return {n: merge_parallel([Cost(**s["ops"][n]) for s in snaps if n in s["ops"]]) for n in names}
