"""Weight-streaming training on Ray (Cerebras' way): the weights and AdamW's state live in a MemoryX actor
off the wafer; the streaming region's tile, an actor of its own, pulls each layer's weights for the forward
and again for the backward and pushes each layer's gradients back, where AdamW updates the weights.

Contract: :class:`StreamingTraining` (host side; a context manager) starts the two actors on a running Ray:
the MemoryX actor (``TrainMemoryX``: a ``training.store.ParamStore`` over the weights; arrays mapped from
the dequantised cache come by reference and are mapped there) and the tile (``TrainTile``), which runs
``training.step.train_step`` against a :class:`StoreClient`. The client keeps the double buffer: while a
layer computes, the next layer of the step's order (0..L-1, then L-1..0) is already on its way. Gradients
go out without waiting (Ray runs one caller's calls to an actor in order, so the next fetch sees the update);
the step waits for its last push. ``step(tokens, step)`` returns the tile's StepReport; ``weights()`` and
``last_grads()`` read MemoryX. Every wait has a deadline (``WAIT_S``); a missed one raises
:class:`TrainingTimeout` naming what did not come.
"""

from __future__ import annotations

import dataclasses

import ray
from ray.exceptions import GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.model.npcache import resolve
from waferrt.training.store import ParamStore
from waferrt.training.step import train_step

WAIT_S = 300.0  # the longest a block, a push or a whole step may take (SmolLM2's step on a loaded machine)


class TrainingTimeout(TimeoutError):
    """A block, a gradient push or a step did not complete in time."""


def _get(ref, what: str):
    try:
        return ray.get(ref, timeout=WAIT_S)
    except GetTimeoutError:
        raise TrainingTimeout(f"{what} did not complete within {WAIT_S:.0f} s") from None


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

    def push_layer(self, i: int, grads, step: int) -> None:
        self.pushes.append(self.handle.push_layer.remote(i, grads, step))

    def push_top(self, top, step: int) -> None:
        pushes, self.pushes = [*self.pushes, self.handle.push_top.remote(top, step)], []
        _get(pushes, f"MemoryX's AdamW updates of step {step}")


class TrainTile:
    """The streaming region's tile of a training run."""

    def __init__(self, memoryx, config):
        self.client = StoreClient(memoryx, config)

    def step(self, tokens, step: int):
        return train_step(self.client, tokens, step)


TrainMemoryXActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(TrainMemoryX)
TrainTileActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(TrainTile)


class StreamingTraining:
    """Host side: MemoryX and the tile started on the running Ray (see the module docstring)."""

    def __init__(self, config, weights, hp):
        node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.memoryx = TrainMemoryXActor.options(scheduling_strategy=node).remote(config, weights, hp)
        self.tile = TrainTileActor.remote(self.memoryx, config)
        try:
            _get(self.memoryx.head.remote(), "MemoryX's start (holding the weights)")
        except BaseException:
            self.close()
            raise

    def step(self, tokens, step: int):
        return _get(self.tile.step.remote(tokens, step), f"training step {step} on the tile")

    def weights(self):
        return _get(self.memoryx.weights.remote(), "MemoryX's weights")

    def last_grads(self) -> dict:
        return _get(self.memoryx.grads.remote(), "MemoryX's last gradients")

    def close(self) -> None:
        for actor in (self.tile, self.memoryx):
            ray.kill(actor, no_restart=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
