"""LocalDecoder: the wafer's tile programs without Ray -- one thread per tile, queues as links.

Contract: ``LocalDecoder(config, weights, placement, algo, k)`` builds every tile's
:class:`~waferrt.decode.TileProgram` over a :class:`~waferrt.fabric.LoopFabric`, loads the packed weights,
and ``generate(requests, sampler, on_token)`` runs continuous batching on it exactly as WaferLLM does over
Ray. For the unit tier and for debugging a placement without actors.
"""

from __future__ import annotations

from waferrt.core.ledger import Ledger
from waferrt.decode.program import TileProgram, merge_steps
from waferrt.decode.setup import DecodeSetup, pack_stages
from waferrt.fabric.loop import LoopFabric
from waferrt.model.sampling import Sampler

from .batching import continuous_batching
from .requests import Completion, GenRequest, GenStats, OnToken


class LocalDecoder:
    def __init__(self, config, weights, placement, algo: str = "ktree", k: int = 2):
        self.placement = placement
        self.setup = DecodeSetup.from_placement(placement, algo, k)
        self.fabric = LoopFabric(placement.mesh)
        tiles = self.setup.stage_tiles()
        self.programs = {t: TileProgram(self.setup, t, self.fabric.links(t), Ledger(placement.spec))
                         for t in placement.mesh.tiles()}
        for s, arrays in pack_stages(self.setup, weights):
            self.programs[tiles[s]].load(s, arrays)
        self._steps = 0

    def _step(self, items: list, resets: list[int]) -> tuple[dict, float]:
        self._steps += 1

        def body(t, links):
            for slot in resets:
                self.programs[t].reset(slot)
            return self.programs[t].step(f"t{self._steps}", items)

        results = self.fabric.run_spmd(body)
        return merge_steps(list(results.values()), len(self.setup.stages()), self.placement.spec.clock_hz)

    def generate(self, requests: list[GenRequest], sampler: Sampler,
                 on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
        return continuous_batching(self._step, self.placement, requests, sampler, on_token)
