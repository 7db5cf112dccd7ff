"""Faults during training: what can go wrong with a step, how it is seen, and the plan of them.

Contract: a gradient payload leaves the wafer with its CRC (``payload_crc``: ``faults.wire.checksum`` of its
arrays in name order); the off-wafer store recomputes it and raises :class:`CorruptGradient` naming the layer
and the step when they differ (``check_payload``). :class:`TrainingFault` is one planned fault: ``kind``
"tile" (the tile running the step dies, its process gone, while it pushes layer `layer`'s gradients of step
`step`) or "corrupt" (that payload gets `bits` bit flips on the wire, after its CRC was taken: ``corrupt``).
``parse`` reads "KIND:STEP[:LAYER]" (the command line's form). Either way the host redoes the step from the
last good weights (the store's state at the step's start), so the weights after N steps are the fault-free
run's, bit for bit. Pure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from waferrt.faults.wire import checksum, flip

TRAINING_KINDS = ("tile", "corrupt")


class CorruptGradient(ValueError):
    """A gradient payload arrived with a CRC that is not its own."""


@dataclass(frozen=True)
class TrainingFault:
    kind: str
    step: int  # the optimizer step (1, 2, ...) it strikes
    layer: int = 0  # whose gradients' push it strikes
    bits: int = 1  # bits a "corrupt" flips

    def __post_init__(self) -> None:
        if self.kind not in TRAINING_KINDS:
            raise ValueError(f"a training fault is one of {', '.join(TRAINING_KINDS)}, got {self.kind!r}")
        if self.step < 1 or self.layer < 0 or self.bits < 1:
            raise ValueError(f"a training fault strikes step >= 1 at layer >= 0 with bits >= 1, got step "
                             f"{self.step}, layer {self.layer}, bits {self.bits}")

    @classmethod
    def parse(cls, text: str) -> TrainingFault:
        """'tile:2' or 'corrupt:3:1' -> the fault (ValueError naming the form otherwise)."""
        kind, *nums = text.split(":")
        try:
            if not 1 <= len(nums) <= 2:
                raise ValueError(text)
            return cls(kind, *(int(n) for n in nums))
        except ValueError:
            raise ValueError(f"{text!r} is not a training fault: write KIND:STEP[:LAYER] with KIND one of "
                             f"{', '.join(TRAINING_KINDS)}, e.g. tile:2 or corrupt:3:1") from None

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
