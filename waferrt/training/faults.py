"""Faults during training: what can go wrong with a step, how it is seen, and the plan of them.

Contract: a gradient payload leaves the wafer with its CRC (``payload_crc``: ``faults.wire.checksum`` of its
arrays in name order); the off-wafer store recomputes it and raises :class:`CorruptGradient` naming the layer
and the step when they differ (``check_payload``). :class:`TrainingFault` is one planned fault: ``kind``
"tile" (the tile running the step dies, its process gone, while it pushes layer `layer`'s gradients of step
`step`), "corrupt" (that payload gets `bits` bit flips on the wire, after its CRC was taken: ``corrupt``)
or "core" (core `core` (x, y) of the mesh kernels' square dies as layer 0's backward starts: the kernel
that needs it raises ``waferrt.faults.CoreFailed``, and the step is re-planned onto a living square of the
same shape). ``parse`` reads "KIND:STEP[:LAYER]" or "core:STEP[:X,Y]" (the command line's forms);
``draw(n, seed, run)`` is a chaos run's n seeded faults of the kinds a :class:`Run` allows. Either way the
host redoes the step from the last good weights (the store's state at the step's start), so the weights
after N steps are the fault-free run's, bit for bit. Pure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from waferrt.faults.model import FaultKind
from waferrt.faults.wire import checksum, flip

TRAINING_KINDS = (FaultKind.TILE, FaultKind.CORRUPT, FaultKind.CORE)
MAX_REDOS = 3  # a step redone more often than this is a failure, not a fault


class TrainingFailed(RuntimeError):
    """A step failed again and again, however often it was redone."""


class CorruptGradient(ValueError):
    """A gradient payload arrived with a CRC that is not its own."""


@dataclass(frozen=True)
class TrainingFault:
    kind: FaultKind  # (its word, "tile", "corrupt" or "core", is taken too)
    step: int  # the optimizer step (1, 2, ...) it strikes
    layer: int = 0  # whose gradients' push it strikes
    bits: int = 1  # bits a "corrupt" flips
    core: tuple[int, int] = (0, 0)  # the core (x, y) of the square a "core" kills

    def __post_init__(self) -> None:
        if self.kind not in TRAINING_KINDS:
            raise ValueError(f"a training fault is one of {', '.join(TRAINING_KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "kind", FaultKind(self.kind))
        if self.step < 1 or self.layer < 0 or self.bits < 1:
            raise ValueError(f"a training fault strikes step >= 1 at layer >= 0 with bits >= 1, got step "
                             f"{self.step}, layer {self.layer}, bits {self.bits}")

        if min(self.core) < 0:
            raise ValueError(f"a core fault names a core (x, y) of the square, x, y >= 0, got {self.core}")

    @classmethod
    def parse(cls, text: str) -> TrainingFault:
        """'tile:2', 'corrupt:3:1' or 'core:2:1,3' -> the fault (ValueError naming the forms otherwise)."""
        kind, *nums = text.split(":")
        try:
            if not 1 <= len(nums) <= 2:
                raise ValueError(text)
            if kind == FaultKind.CORE:  # the word the text gives
                x, y = (int(n) for n in nums[1].split(",")) if len(nums) == 2 else (0, 0)
                return cls(kind, int(nums[0]), core=(x, y))
            return cls(kind, *(int(n) for n in nums))
        except ValueError:
            raise ValueError(f"{text!r} is not a training fault: write KIND:STEP[:LAYER] with KIND one of tile, "
                             "corrupt (e.g. tile:2 or corrupt:3:1), or core:STEP[:X,Y] (e.g. core:2:1,3)") from None

    def __str__(self) -> str:
        return f"core:{self.step}:{self.core[0]},{self.core[1]}" if self.kind is FaultKind.CORE else \
            f"{self.kind}:{self.step}:{self.layer}"

    def strikes(self, step: int, layer: int) -> bool:
        return (self.step, self.layer) == (step, layer)


def payload_crc(grads: dict[str, np.ndarray]) -> int:
    """The CRC of a gradient payload (its arrays in name order)."""
    return checksum([grads[n] for n in sorted(grads)])


def check_payload(grads: dict[str, np.ndarray], crc: int, what: str) -> None:
    """CorruptGradient naming `what` when the payload's CRC is not `crc`."""
    got = payload_crc(grads)
    if got != crc:
        raise CorruptGradient(f"{what} arrived corrupted (CRC {got:#010x}, sent as {crc:#010x})")


def corrupt(grads: dict[str, np.ndarray], bits: int, seed: int) -> dict[str, np.ndarray]:
    """The payload with `bits` bit flips (seeded), as the wire would deliver it."""
    names = sorted(grads)
    return dict(zip(names, flip([grads[n] for n in names], bits, random.Random(seed)), strict=True))


@dataclass(frozen=True)
class Run:
    """What a chaos run's faults are drawn over: its steps, the model's layers, the kinds this run can
    recover from, the side of the mesh kernels' square (the cores a "core" fault can kill) and its spare
    squares (disjoint squares beside it: a dead core spends at most one, so at most `spares` are drawn)."""

    steps: int
    layers: int
    kinds: tuple[FaultKind, ...]  # (their words are taken too)
    side: int = 1
    spares: int = 0

    def __post_init__(self) -> None:
        if min(self.steps, self.layers, self.side) < 1 or not set(self.kinds) <= set(TRAINING_KINDS) \
                or not self.kinds:
            raise ValueError(f"a chaos run has steps, layers and a square side >= 1 and kinds among "
                             f"{TRAINING_KINDS}, got {self}")
        object.__setattr__(self, "kinds", tuple(FaultKind(k) for k in self.kinds))


def draw(n: int, seed: int, run: Run) -> list[TrainingFault]:
    """n faults drawn (seeded) over the run: a kind, a step (at most MAX_REDOS faults a step), a layer (tile,
    corrupt) or a core (core); ValueError when n is more than the run's steps can take."""
    kinds = [k for k in run.kinds if k is not FaultKind.CORE]
    most = MAX_REDOS * run.steps if kinds else min(MAX_REDOS * run.steps, run.spares)
    if n > most:
        spares = f" and a dead core spends one of {run.spares} spare squares" if FaultKind.CORE in run.kinds else ""
        raise ValueError(f"{n} faults over {run.steps} steps: a step is redone at most {MAX_REDOS} times{spares}; "
                         f"draw at most {most}")
    rng, out = random.Random(seed), []
    for _ in range(n):
        cores = sum(f.kind is FaultKind.CORE for f in out)
        kind = rng.choice([k for k in run.kinds if k is not FaultKind.CORE or cores < run.spares])
        step = rng.choice([s for s in range(1, run.steps + 1) if sum(f.step == s for f in out) < MAX_REDOS])
        core = (rng.randrange(run.side), rng.randrange(run.side))
        dies = kind is FaultKind.CORE
        out.append(TrainingFault(kind, step, 0 if dies else rng.randrange(run.layers), bits=rng.randint(1, 4),
                                 core=core if dies else (0, 0)))
    return out
