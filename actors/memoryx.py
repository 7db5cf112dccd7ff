"""MemoryX: the off-wafer weight memory of a streaming decode, a Ray actor (a process of its own) the tiles pull from.

Contract: :func:`start_memoryx` starts one actor on the driver's node holding the model's weights (arrays
mapped from the dequantised cache come by reference and are mapped there) as a
:class:`~waferrt.decode.streaming.WeightStore` cut for the streaming region; :func:`stop_memoryx` kills it.
:class:`StreamClient` is what the streaming region's tile attaches (``TileProgram.attach``): ``layer(i)``,
``head(k)`` and ``rows(tokens)`` fetch through Ray's object store, and while a block computes the next one
in the decode's order (layer 0 .. L-1, then the head's chunks) is already on its way -- the double buffer:
at most two blocks asked for at once. Every fetch has a deadline (``FETCH_S``); a MemoryX that does not
answer raises :class:`MemoryXTimeout` naming the block.
"""

from __future__ import annotations

import ray
from ray.exceptions import GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.decode.stage import StageKind
from waferrt.decode.streaming import StreamBlock, WeightStore, stream_order
from waferrt.model.npcache import resolve

FETCH_S = 60.0  # the longest a block may take to come


class MemoryXTimeout(TimeoutError):
    """MemoryX did not send a block in time."""


class MemoryX:
    """The actor's class: a WeightStore over the weights, resolved (mapped) here."""

    def __init__(self, config, region, dtype: str, weights):
        self.store = WeightStore(config, region, dtype, resolve(weights))

    def head_count(self) -> int:
        return self.store.head_count

    def block(self, key: StreamBlock):
        return self.store.block(key)

    def rows(self, tokens):
        return self.store.rows(tokens)


MemoryXActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(MemoryX)


def start_memoryx(config, region, dtype: str, weights):
    """A MemoryX actor on this (the driver's) node; `weights` as npcache.by_reference gives them."""
    node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    handle = MemoryXActor.options(scheduling_strategy=node).remote(config, region, dtype, weights)
    try:
        ray.get(handle.head_count.remote(), timeout=FETCH_S)  # up and holding the weights
    except GetTimeoutError:
        ray.kill(handle)
        raise MemoryXTimeout(f"MemoryX did not start within {FETCH_S:.0f} s") from None
    return handle


def stop_memoryx(handle) -> None:
    ray.kill(handle, no_restart=True)


class StreamClient:
    """A tile's side of MemoryX (see the module docstring)."""

    def __init__(self, handle, n_layers: int, head_count: int):
        self.handle, self.head_count = handle, head_count
        self.order = stream_order(n_layers, head_count)
        self.ahead: dict[StreamBlock, object] = {}  # blocks asked for before their turn

    def layer(self, i: int):
        return self._block(StreamBlock(StageKind.LAYER, i))

    def head(self, k: int):
        return self._block(StreamBlock(StageKind.HEAD, k))

    def rows(self, tokens):
        return self._get(self.handle.rows.remote(tokens), "the embedding rows")

    def _block(self, key: StreamBlock):
        ref = self.ahead.pop(key, None) or self.handle.block.remote(key)
        nxt = self.order[(self.order.index(key) + 1) % len(self.order)]
        if nxt not in self.ahead:
            self.ahead = {k: r for k, r in self.ahead.items() if k != key}
            self.ahead[nxt] = self.handle.block.remote(nxt)  # streams in while this block computes
        return self._get(ref, f"{key.kind.value} block {key.index}")

    def _get(self, ref, what: str):
        try:
            return ray.get(ref, timeout=FETCH_S)
        except GetTimeoutError:
            raise MemoryXTimeout(f"MemoryX did not send {what} within {FETCH_S:.0f} s") from None
