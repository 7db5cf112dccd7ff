"""Weight-streaming training on Ray (Cerebras' way): the weights and AdamW's state live in a MemoryX actor
off the wafer; the streaming region's tile, an actor of its own, pulls each layer's weights for the forward
and again for the backward and pushes each layer's gradients back, where AdamW updates the weights.

Contract: :class:`StreamingTraining` (host side; a context manager) starts the two actors on a running Ray:
the MemoryX actor (``TrainMemoryX``: a ``training.store.ParamStore`` over the weights; arrays mapped from
the dequantised cache come by reference and are mapped there) and the tile (``TrainTile``), which runs
``training.step.train_step`` against a :class:`StoreClient`, with the reference's phases or, given ``wafer``
(a function making an unopened Wafer, e.g. ``functools.partial(Wafer, spec, mesh=(w, h), tile=(w, h),
backend="local")``: the host's to make, this floor being below the runtime's), the mesh kernels'
(``training.mesh``) on the tile's own Wafer. The client keeps the double buffer: while a
layer computes, the next layer of the step's order (0..L-1, then L-1..0) is already on its way. Gradients
go out without waiting (Ray runs one caller's calls to an actor in order, so the next fetch sees the update);
the step waits for its last push. ``step(tokens, step)`` returns the tile's StepReport; ``weights()`` and
``last_grads()`` read MemoryX. Every wait has a deadline (``WAIT_S``); a missed one raises
:class:`TrainingTimeout` naming what did not come.
Faults (``training.faults.TrainingFault``, armed on the tile one at a time): the host marks each attempt of a
step with an epoch (MemoryX keeps the state at its start and drops pushes of other epochs); a tile that dies
(``os._exit``) or a payload MemoryX finds corrupted (``CorruptGradient``) rolls MemoryX back and the step is
redone on a (fresh) tile; a "core" fault (with ``wafer``) kills a core of the tile's square as the backward
starts (``training.resident.dying``), the tile's kernel raises ``CoreFailed``, MemoryX rolls back and the same
tile redoes the step on the next living square of the same shape (its Wafer knows the dead core); so the
weights after N steps are the fault-free run's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import os

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.faults import CoreFailed
from waferrt.faults.model import FaultKind
from waferrt.model.npcache import resolve
from waferrt.training.faults import MAX_REDOS, CorruptGradient, TrainingFailed, corrupt
from waferrt.training.mesh import phases_of
from waferrt.training.onwafer import living_square
from waferrt.training.resident import dying
from waferrt.training.step import train_step
from waferrt.training.store import ParamStore

WAIT_S = 300.0  # the longest a block, a push or a whole step may take (SmolLM2's step on a loaded machine)


class TrainingTimeout(TimeoutError):
    """A block, a gradient push or a step did not complete in time."""


def _get(ref, what: str):
    try:
        return ray.get(ref, timeout=WAIT_S)
    except GetTimeoutError:
        raise TrainingTimeout(f"{what} did not complete within {WAIT_S:.0f} s") from None


def _cause(e: BaseException) -> str:
    """A tile's error as one line: the one naming the error's class (else its last), after the class's name."""
    lines = str(e).strip().splitlines()
    line = next((x for x in reversed(lines) if "CorruptGradient: " in x or "CoreFailed: " in x), lines[-1])
    return line.split("CorruptGradient: ")[-1].split("CoreFailed: ")[-1]


class TrainMemoryX(ParamStore):
    """The MemoryX actor's class: a ParamStore over the weights, resolved (mapped) here (a tied head, mapped
    apart from the embedding, is tied again)."""

    def __init__(self, config, weights, hp):
        weights = resolve(weights)
        if config.tie_embeddings:
            weights = dataclasses.replace(weights, head=weights.embed)
        super().__init__(config, weights, hp)

    def grads(self) -> dict:
        return self.last_grads


class StoreClient:
    """The tile's side of MemoryX: ParamStore's interface over the actor, layers prefetched in step order."""

    def __init__(self, handle, config):
        self.handle, self.config = handle, config
        self.order = list(range(config.n_layers)) + list(reversed(range(config.n_layers)))
        self.pending: dict[int, object] = {}  # position in the order -> the layer's fetch in flight
        self.at, self.pushes = 0, []
        self.fault = None  # a TrainingFault armed on this tile

    def rows(self, inputs):
        self.at = 0
        self.pending = {0: self.handle.layer.remote(self.order[0])}
        return _get(self.handle.rows.remote(inputs), "MemoryX's embedding rows")

    def layer(self, i: int):
        ref = self.pending.pop(self.at)
        if self.at + 1 < len(self.order):  # the double buffer: the next block streams while this one computes
            self.pending[self.at + 1] = self.handle.layer.remote(self.order[self.at + 1])
        self.at += 1
        return _get(ref, f"MemoryX's layer {i}")

    def head(self):
        return _get(self.handle.head.remote(), "MemoryX's head")

    def push_layer(self, i: int, grads, push) -> None:
        fault = self.fault
        if fault is not None and fault.kind is not FaultKind.CORE and fault.strikes(push.step, i):
            self.fault = None  # a fault strikes once
            if fault.kind is FaultKind.TILE:
                os._exit(1)  # the tile's process dies mid-step: some layers' updates made, the others not
            grads = corrupt(grads, fault.bits, seed=push.step)  # flipped on the wire, after the CRC was taken
        self.pushes.append(self.handle.push_layer.remote(i, grads, push))

    def push_top(self, top, push) -> None:
        pushes, self.pushes = [*self.pushes, self.handle.push_top.remote(top, push)], []
        _get(pushes, f"MemoryX's AdamW updates of step {push.step}")


class TrainTile:
    """The streaming region's tile of a training run: the reference's phases, or the mesh kernels' on the Wafer
    `wafer()` makes, opened here (its cores emulated in the tile's process with ``backend="local"``)."""

    def __init__(self, memoryx, config, fault=None, wafer=None):
        self.client = StoreClient(memoryx, config)
        self.client.fault = fault
        self.wafer = None if wafer is None else wafer().open()
        self.phases = phases_of("reference" if wafer is None else "mesh", self.wafer)

    def step(self, tokens, step: int, epoch: int):
        fault, phases = self.client.fault, self.phases
        if fault is not None and fault.kind is FaultKind.CORE and fault.step == step:  # a core of the square dies
            self.client.fault, phases = None, dying(phases, self.wafer, fault)
        try:
            return train_step(self.client, tokens, step, phases, epoch)
        except CoreFailed as e:  # one line for the host: how many of the step's blocks died with the core
            raise CoreFailed(e.core, (f"{len(e.lost)} DSM blocks of the step, made again by the redo",),
                             e.where) from None

    def arm(self, fault) -> None:
        """Arm the next planned fault on this tile (after a dead core: its Wafer remembers the dead)."""
        self.client.fault = fault

    def square(self) -> str:
        """Where the kernels run now (after a dead core, the next living square of the same shape)."""
        region, _ = living_square(self.wafer, "the training step")
        return f"the {region.w}x{region.h} square at ({region.x0}, {region.y0})"

    def booked_cycles(self) -> float:
        """What the tile's kernels booked so far (0 with the reference's phases)."""
        return 0.0 if self.wafer is None else self.wafer.cost().total.cycles


TrainMemoryXActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(TrainMemoryX)
TrainTileActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(TrainTile)


class StreamingTraining:
    """Host side: MemoryX and the tile started on the running Ray (see the module docstring)."""

    def __init__(self, config, weights, hp, faults=(), wafer=None):
        node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.config, self.epoch, self.recoveries, self.wafer = config, 0, [], wafer
        self.faults = sorted(faults, key=lambda f: (f.step, -f.layer))  # in the order they strike (backward: L-1..0)
        self.memoryx = TrainMemoryXActor.options(scheduling_strategy=node).remote(config, weights, hp)
        self.tile = None
        try:
            _get(self.memoryx.head.remote(), "MemoryX's start (holding the weights)")
            self.tile = self._new_tile()
        except BaseException:
            self.close()
            raise

    def _new_tile(self):
        """A tile actor, armed with the next planned fault (one at a time: each strikes once)."""
        return TrainTileActor.remote(self.memoryx, self.config, self.faults.pop(0) if self.faults else None,
                                     self.wafer)

    def step(self, tokens, step: int):
        """Step `step`, redone from the last good weights after a dead tile or a corrupted gradient payload
        (each recovery a line in ``recoveries``), at most MAX_REDOS times."""
        for _ in range(MAX_REDOS + 1):
            self.epoch += 1
            _get(self.memoryx.begin_step.remote(self.epoch), f"MemoryX's start of step {step}")
            try:
                return _get(self.tile.step.remote(tokens, step, self.epoch), f"training step {step} on the tile")
            except (ActorDiedError, CorruptGradient, CoreFailed) as e:
                died = isinstance(e, ActorDiedError)
                cause = "the tile died" if died else _cause(e)
                _get(self.memoryx.rollback.remote(), f"MemoryX's rollback of step {step}")
                if isinstance(e, CoreFailed):
                    cause += f"; re-planned onto {_get(self.tile.square.remote(), 'the tile square')}"
                self.recoveries.append(f"step {step}: {cause}; redone from the last good weights")
                if isinstance(e, CoreFailed):  # the same tile (its Wafer knows the dead core) takes the next fault
                    _get(self.tile.arm.remote(self.faults.pop(0) if self.faults else None), "the tile's arming")
                elif died:
                    self.tile = self._new_tile()
                elif self.faults:  # the next fault goes to a fresh tile
                    ray.kill(self.tile, no_restart=True)
                    self.tile = self._new_tile()
        raise TrainingFailed(f"training step {step} failed {MAX_REDOS + 1} times: {self.recoveries[-1]}")

    def weights(self):
        return _get(self.memoryx.weights.remote(), "MemoryX's weights")

    def last_grads(self) -> dict:
        return _get(self.memoryx.grads.remote(), "MemoryX's last gradients")

    def close(self) -> None:
        for actor in (self.tile, self.memoryx):
            if actor is not None:
                ray.kill(actor, no_restart=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
