"""The resident mode's trainer: the store and the step in this process, planned faults seen and recovered from.

Contract: ``ResidentTraining(config, weights, hp, phases, wafer=None, faults=())`` keeps a ParamStore (the
region's SRAM holds the weights, gradients and AdamW's moments) and runs ``step.train_step`` with `phases`
(the mesh kernels' on `wafer`, or the reference's). Its ``faults`` (``faults.TrainingFault``) strike one per
attempt of their step: "core" kills a core of the kernels' current square (``onwafer.living_square``) on
`wafer` as layer 0's backward (the step's last) starts (``wafer.inject(CoreFailure)``: the next kernel needing it raises
``CoreFailed``); "corrupt" flips bits of a layer's gradient payload after its CRC was taken (the store's
``check_payload`` raises ``CorruptGradient``). Either way the store rolls back to the step's start
(``begin_step`` / ``rollback``) and the step is redone -- after a dead core on the first living square of the
same shape (``living_square`` skips the dead), so the float summation order and the weights after N steps are
the fault-free run's, bit for bit. Each recovery is a line in ``recoveries`` (what failed, where, what was
done); a step failing more than ``faults.MAX_REDOS`` times raises ``faults.TrainingFailed``. A "tile" fault
has no meaning here (the tile is this process) and is refused.
"""

from __future__ import annotations

import dataclasses

from waferrt.core.mesh import Coord
from waferrt.faults import CoreFailed, CoreFailure, Trigger
from waferrt.faults.model import FaultKind

from .faults import MAX_REDOS, CorruptGradient, TrainingFailed, corrupt
from .onwafer import living_square
from .step import Phases, train_step
from .store import ParamStore


class _Wire:
    """The store as a step sees it, with a "corrupt" fault's bit flips on one layer's gradient push."""

    def __init__(self, store: ParamStore, fault):
        self.store, self.fault = store, fault

    def __getattr__(self, name):
        return getattr(self.store, name)

    def push_layer(self, i: int, grads, push) -> None:
        if self.fault is not None and self.fault.strikes(push.step, i):
            grads = corrupt(grads, self.fault.bits, seed=push.step)
        self.store.push_layer(i, grads, push)


def dying(phases: Phases, wafer, fault) -> Phases:
    """`phases` whose backward arms the "core" `fault` on `wafer` as layer 0's backward (the step's last) starts,
    the other layers' updates made: its core (x, y) of the current square dies at the next kernel command, the
    one that needs it raising CoreFailed."""
    backward, calls = phases.backward, []

    def backward_dying(dy, saved, layer, rope):
        calls.append(layer)
        if len(calls) == layer.config.n_layers:
            square, _ = living_square(wafer, "the training step")
            x, y = fault.core
            if x >= square.w or y >= square.h:
                raise ValueError(f"fault {fault}: core ({x}, {y}) is outside the {square.w}x{square.h} square")
            wafer.inject(CoreFailure(Coord(square.x0 + x, square.y0 + y), Trigger(step=1)))
        return backward(dy, saved, layer, rope)

    return dataclasses.replace(phases, backward=backward_dying)


def replanned(e: CoreFailed, wafer) -> str:
    """What a dead core's recovery did: the square the kernels run on from now."""
    square, _ = living_square(wafer, "the training step")
    return (f"core {e.core} died ({e.where or 'in a kernel'}); re-planned onto the {square.w}x{square.h} square at "
            f"({square.x0}, {square.y0})")


class ResidentTraining:
    """The resident mode's trainer (module doc)."""

    def __init__(self, config, weights, hp, phases: Phases, wafer=None, faults=()):
        refused = next((f for f in faults if f.kind is FaultKind.TILE or (f.kind is FaultKind.CORE and wafer is None)),
                       None)
        if refused is not None:
            raise ValueError(f"fault {refused}: the resident mode recovers from core (with the mesh kernels: --on "
                             "mesh) and corrupt faults; a dead tile needs --streaming")
        self.store, self.phases, self.wafer = ParamStore(config, weights, hp), phases, wafer
        self.faults = sorted(faults, key=lambda f: (f.step, -f.layer))
        self.recoveries: list[str] = []
        self.epoch = 0

    def step(self, tokens, step: int):
        """Step `step`, redone from the last good weights after each planned fault (module doc)."""
        for _ in range(MAX_REDOS + 1):
            self.epoch += 1
            self.store.begin_step(self.epoch)
            fault = next((f for f in self.faults if f.step == step), None)
            if fault is not None:
                self.faults.remove(fault)
            try:
                wire = _Wire(self.store, fault if fault and fault.kind is FaultKind.CORRUPT else None)
                return train_step(wire, tokens, step, self._phases(fault), self.epoch)
            except (CoreFailed, CorruptGradient) as e:
                self.store.rollback()
                self.recoveries.append(f"step {step}: {self._what(e, step)}; redone from the last good weights")
        raise TrainingFailed(f"training step {step} failed {MAX_REDOS + 1} times: {self.recoveries[-1]}")

    def _phases(self, fault) -> Phases:
        dies = fault is not None and fault.kind is FaultKind.CORE
        return dying(self.phases, self.wafer, fault) if dies else self.phases

    def _what(self, e, step: int) -> str:
        if isinstance(e, CorruptGradient):
            return str(e)
        try:
            return replanned(e, self.wafer)
        except ValueError:
            dead, m = sorted(self.wafer.fault_map().cores), self.wafer.mesh
            raise TrainingFailed(f"step {step}: no square of {min(m.width, m.height)} cores a side is left on the "
                                 f"{m.width}x{m.height} mesh, whose dead cores are {dead}: give a wider --mesh "
                                 "(more spare squares)") from None

    def weights(self):
        return self.store.weights()

    def last_grads(self) -> dict:
        return self.store.last_grads

    def close(self) -> None:
        pass
