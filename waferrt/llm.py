"""LLM generation on the emulated wafer: the join of the scheduler's placement, the decode and the tile actors.

Contract: :class:`WaferLLM` takes a Llama model (config + float32 weights) and a scheduler Placement,
starts the tile actors (``waferrt.Wafer``), books every stage's SRAM and loads its weight blocks into its
tile, and generates with continuous batching (``waferrt.serving.continuous_batching``): each decode step
is one command to every tile (a prompt enters the pipeline whole, token after token, through the decode
path), the activations flow tile to tile over the fabric, logits leave at the head's tile, and the host
samples (request i with ``numpy.random.default_rng([seed, i])``, as the reference does). It reaches the
tiles only through ``Wafer.call`` with the :class:`~waferrt.actors.tile.Tile` methods themselves.
"""

from __future__ import annotations

from collections.abc import Callable

from waferrt.actors.tile import Tile
from waferrt.core.mesh import DEFAULT_MAX_TILES
from waferrt.decode.program import merge_steps
from waferrt.decode.setup import DecodeSetup, pack_stages
from waferrt.model.config import LlamaConfig
from waferrt.model.sampling import Sampler
from waferrt.serving.batching import continuous_batching
from waferrt.serving.requests import Completion, GenRequest, GenStats, OnToken

from .runtime import Wafer


class WaferLLM:
    def __init__(self, config: LlamaConfig, weights, placement, address: str | None = None,
                 algo: str = "ktree", k: int = 2, timeout: float = 120.0, max_tiles: int = DEFAULT_MAX_TILES):
        self.config, self.weights, self.placement = config, weights, placement
        self.setup = DecodeSetup.from_placement(placement, algo, k)
        self.setup.stage_tiles()  # a placement the decode cannot run fails here, before Ray starts
        self.wafer = Wafer(placement.spec, placement.mesh, address=address, timeout=timeout, max_tiles=max_tiles)

    def __enter__(self) -> WaferLLM:
        return self if self.wafer.tiles else self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, progress: Callable[[str], None] | None = None) -> WaferLLM:
        say = progress or (lambda msg: None)
        mesh = self.placement.mesh
        say(f"starting {len(mesh.tiles())} tile actors for {mesh}")
        self.wafer.open(progress=lambda i, n: say(f"tile actors up: {i}/{n}"), node_ids=self._node_ids())
        try:
            self.wafer.on_every_tile(Tile.decode_setup, self.setup)
            self._load_weights(say)
        except BaseException:
            self.close()
            raise
        return self

    def _node_ids(self) -> dict:
        names = {name for _, name in self.placement.tile_nodes}
        return {} if len(names) <= 1 else dict(self.placement.tile_nodes)

    def _load_weights(self, say) -> None:
        tiles = self.setup.stage_tiles()
        n = sum(1 for kind, _, _ in self.setup.stages() if kind != "head")
        for i, (s, arrays) in enumerate(pack_stages(self.setup, self.weights)):
            self.wafer.call([(tiles[s], Tile.decode_load, (s, arrays))])
            say(f"weights into core SRAM: {i + 1}/{n} regions")

    def close(self) -> None:
        self.wafer.close()

    def _step(self, items: list, resets: list[int]) -> tuple[dict, float]:
        results = self.wafer.on_every_tile(Tile.decode_step, self.wafer.next_epoch(), items, resets)
        return merge_steps(results, len(self.setup.stages()), self.placement.spec.clock_hz)

    def generate(self, requests: list[GenRequest], sampler: Sampler,
                 on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
        return continuous_batching(self._step, self.placement, requests, sampler, on_token)
