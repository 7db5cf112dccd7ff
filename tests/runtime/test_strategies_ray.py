"""Every parallelism strategy and weight streaming on tile actors over Ray + pyzmq: the tiny model's tokens equal
the reference's.

- layer regions, two layers per region and one region for all three (tensor) on a 2x2-tile mesh;
- weight streaming on a one-tile mesh whose SRAM is smaller than the weights: a MemoryX actor holds them and
  the region's tile pulls them block by block; the actor is gone after close.
"""

import pytest
import ray

from waferrt.actors.tile import Tile
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, PlanOptions, Strategy, plan
from waferrt.scheduler.budget import work_bytes
from waferrt.scheduler.placement import plan_streaming, streaming_mesh
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
REQUESTS = [GenRequest((5, 6, 7), 6), GenRequest((100, 3), 5), GenRequest((9,), 7)]
SAMPLER = Sampler(temperature=0.8, top_p=0.9, seed=5)


def _decoded(placement):
    with WaferLLM(CFG, W, placement) as llm:
        got, stats = llm.generate(REQUESTS, SAMPLER)
    return [c.tokens for c in got], stats


@pytest.mark.parametrize("group", [1, 2, 3], ids=["layer", "grouped:2", "tensor"])
def test_each_strategy_on_tile_actors_equals_the_reference(ray_session, group):
    p = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 3),
             options=PlanOptions(strategy=Strategy(group, CFG.n_layers)))
    want, _ = generate_reference(CFG, W, REQUESTS, SAMPLER)
    got, stats = _decoded(p)
    assert got == [c.tokens for c in want] and stats.wafer_tokens_per_s > 0


def test_weight_streaming_decodes_on_a_mesh_too_small_for_the_weights(ray_session):
    kv = KVReserve(16, 3)
    mesh = streaming_mesh(CFG, TINY, kv)
    embed, layer = work_bytes(CFG, "float32")
    assert mesh.width * mesh.height * TINY.sram_bytes < embed + CFG.n_layers * layer  # cannot hold the weights
    p = plan_streaming(CFG, TINY, mesh, kv=kv)
    want, _ = generate_reference(CFG, W, REQUESTS, SAMPLER)
    with WaferLLM(CFG, W, p) as llm:
        got, stats = llm.generate(REQUESTS, SAMPLER)
        memoryx = llm.memoryx
        held = sum(llm.wafer.on_every_tile(Tile.decode_bytes))  # K/V only: the blocks left after their turn
    assert 0 < held < embed + CFG.n_layers * layer
    assert [c.tokens for c in got] == [c.tokens for c in want] and stats.wafer_tokens_per_s > 0
    with pytest.raises(ray.exceptions.RayActorError):  # the MemoryX actor went with the wafer
        ray.get(memoryx.head_count.remote(), timeout=30)
