"""The cost ledger: where the emulated primitives book what they would cost on the modelled wafer.

Contract: a :class:`Ledger` collects :class:`~waferrt.core.cost.Cost` records by primitive name. A
primitive opens ``with ledger.op("allreduce.ktree"):``; every routed message inside books one routing stage
with ``ledger.message(...)`` (critical-path hops, messages, link bytes, cycles), ``with
ledger.concurrent():`` folds several messages that travel at once into one stage, ``with
ledger.streamed():`` books stages whose message is forwarded word by word (the caller books its serialisation
once), and ``ledger.add(cost)`` books a closed-form Cost. Only the outermost op is booked under its name, so a
MeshGEMV's allreduce counts as part of the GEMV. Ledgers of several tiles that ran the same SPMD program merge with
:func:`merge_parallel`: critical-path figures take the max, traffic adds up.
Internally the figures are plain lists (hops, stages, link_bytes, messages, flops, cycles): booking is on
the decode's hot path.
"""

from __future__ import annotations

from contextlib import contextmanager

from .cost import Cost, flop_cycles, message_cycles, total
from .dtypes import check_dtype
from .spec import HardwareSpec

HOPS, STAGES, LINK, MSGS, FLOPS, CYCLES = range(6)


class Ledger:
    """`dtype`: what the cores compute at (a decode's storage dtype): flops take that dtype's rate."""

    def __init__(self, spec: HardwareSpec, dtype: str = "float32"):
        self.spec, self.dtype = spec, check_dtype(dtype)
        self._by_op: dict[str, list] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list] = []
        self._group: list[list] | None = None
        self._streamed = False
        self.quiet = False  # inside a replay of bookings already known: book nothing (Ledger.replay)

    def op(self, name: str) -> _Op:
        """``with ledger.op(name):`` -- what is booked inside counts under `name` (or its outermost op's)."""
        return _QUIET if self.quiet else _Op(self, name)

    def replay(self, memo: dict, key) -> _Replay:
        """``with ledger.replay(memo, key):`` -- the bookings inside (all inside an op) are the same every
        time for the same `key`: the first time they are booked and their sum kept in memo[key]; after that
        the sum is booked at once and the ledger is quiet inside (compute / add / message / op book nothing).
        For a hot path that books the same closed forms every step (waferrt.decode.shards.LayerShard.run)."""
        return _Replay(self, memo, key)

    def message(self, hops: int, nbytes: float, messages: int, link_bytes: float | None = None) -> None:
        """One routing stage: `messages` messages of `nbytes` each travel `hops` hops (a multicast passes
        each link once: give its `link_bytes`)."""
        if self.quiet:
            return
        if link_bytes is None:
            link_bytes = messages * nbytes * hops
        # a streamed step's message is serialised once per stream, booked by its caller
        rec = [hops, 1, link_bytes, messages, 0, message_cycles(self.spec, hops, 1, 0 if self._streamed else nbytes)]
        if self._group is not None:
            self._group.append(rec)
        elif self._stack:
            _add(self._stack[-1], rec)
        else:
            raise RuntimeError("a message was booked outside a primitive; wrap it in ledger.op(name)")

    @contextmanager
    def streamed(self):
        """Messages booked inside are streamed word by word through the cores that forward them (a pipelined
        chain): each stage pays its hops and beta, not the serialisation; the caller books that once."""
        outer, self._streamed = self._streamed, True
        try:
            yield
        finally:
            self._streamed = outer

    @contextmanager
    def at_rate(self, dtype: str):
        """Flops booked inside take `dtype`'s rate (work on values of another width than the ledger's, e.g.
        sparse attention's 16-bit prediction, float32 comparisons)."""
        outer, self.dtype = self.dtype, check_dtype(dtype)
        try:
            yield
        finally:
            self.dtype = outer

    @contextmanager
    def concurrent(self):
        """Messages booked inside travel at the same time: one stage, the longest one's latency."""
        outer, self._group = self._group, []
        try:
            yield
        finally:
            group, self._group = self._group, outer
            if group:
                merged = list(max(group, key=lambda r: r[CYCLES]))
                merged[LINK] = sum(r[LINK] for r in group)
                merged[MSGS] = sum(r[MSGS] for r in group)
                if self._group is not None:
                    self._group.append(merged)
                else:
                    _add(self._stack[-1], merged)

    def add(self, cost: Cost) -> None:
        """Book a piece of work whose cost a closed form gives (e.g. a hand-over between regions)."""
        if self.quiet:
            return
        _add(self._stack[-1], [cost.hops, cost.stages, cost.link_bytes, cost.messages, cost.flops, cost.cycles])

    def compute(self, flops: int) -> None:
        """`flops` on the busiest core of the primitive, at the ledger's dtype."""
        if self.quiet:
            return
        _add(self._stack[-1], [0, 0, 0.0, 0, flops, flop_cycles(self.spec, flops, self.dtype)])

    @property
    def by_op(self) -> dict[str, Cost]:
        return {k: _cost(v) for k, v in self._by_op.items()}

    def total(self) -> Cost:
        return total(self.by_op.values())

    def cycles(self) -> float:
        return sum(v[CYCLES] for v in self._by_op.values())

    def snapshot(self) -> dict:
        return {"ops": {k: v.as_dict() for k, v in self.by_op.items()}, "calls": dict(self.calls)}

    def clear(self) -> None:
        self._by_op.clear()
        self.calls.clear()


class _Op:
    """The context of Ledger.op (a plain class: it is entered ~10 times per layer and step)."""

    __slots__ = ("ledger", "name", "acc")

    def __init__(self, ledger: Ledger, name: str):
        self.ledger, self.name = ledger, name

    def __enter__(self) -> None:
        self.acc = [0, 0, 0.0, 0, 0, 0.0]
        self.ledger._stack.append(self.acc)

    def __exit__(self, *exc) -> None:
        ledger, acc = self.ledger, self.acc
        ledger._stack.pop()
        if ledger._stack:
            _add(ledger._stack[-1], acc)
        else:
            _add(ledger._by_op.setdefault(self.name, [0, 0, 0.0, 0, 0, 0.0]), acc)
            ledger.calls[self.name] = ledger.calls.get(self.name, 0) + 1


class _Quiet:
    """The op of a quiet ledger: books nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_QUIET = _Quiet()


class _Replay:
    """The context of Ledger.replay."""

    __slots__ = ("ledger", "memo", "key", "acc")

    def __init__(self, ledger: Ledger, memo: dict, key):
        self.ledger, self.memo, self.key = ledger, memo, key

    def __enter__(self) -> None:
        ledger = self.ledger
        if not ledger._stack or ledger.quiet or ledger._group is not None:
            raise RuntimeError("Ledger.replay runs inside an op, outside concurrent() and other replays")
        known = self.memo.get(self.key)
        if known is not None:
            _add(ledger._stack[-1], known)
            ledger.quiet, self.acc = True, None
        else:
            self.acc = [0, 0, 0.0, 0, 0, 0.0]
            ledger._stack.append(self.acc)

    def __exit__(self, kind, *exc) -> None:
        ledger = self.ledger
        if self.acc is None:
            ledger.quiet = False
            return
        ledger._stack.pop()
        _add(ledger._stack[-1], self.acc)
        if kind is None:  # a section that failed half-way is not kept
            self.memo[self.key] = self.acc


def _add(acc: list, rec: list) -> None:
    acc[0] += rec[0]
    acc[1] += rec[1]
    acc[2] += rec[2]
    acc[3] += rec[3]
    acc[4] += rec[4]
    acc[5] += rec[5]


def _cost(v: list) -> Cost:
    return Cost(hops=int(v[HOPS]), stages=int(v[STAGES]), link_bytes=int(round(v[LINK])), messages=int(v[MSGS]),
                flops=int(v[FLOPS]), cycles=float(v[CYCLES]))


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
