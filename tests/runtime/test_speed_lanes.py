"""How many micro-batches a WaferLLM keeps in flight by default (no Ray starts: the tiles are not opened).

Two lanes let the tiles of a pipeline compute side by side; when one tile runs every stage of a placement in
SRAM a second lane would only cut each step's batch in two (two BLAS calls of half the tokens), so it runs
one; a weight-streaming placement keeps two (its schedule is modelled so); an explicit ``lanes`` wins.
"""

from __future__ import annotations

import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.llm import WaferLLM
from waferrt.model import tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.scheduler.placement import plan_streaming

CFG = tiny_config()


@pytest.mark.parametrize(("mesh", "lanes"), [(MeshSpec(16, 16, 16, 16), 1), (MeshSpec(16, 16, 8, 8), 2),
                                             (MeshSpec(16, 16, 16, 8), 2)], ids=["one tile", "2x2", "1x2"])
def test_one_tile_runs_one_lane_a_pipeline_two(mesh, lanes):
    llm = WaferLLM(CFG, None, plan(CFG, TINY, mesh, kv=KVReserve(32, 4)))
    assert llm.lanes == lanes and not llm.wafer.tiles  # nothing started


def test_streaming_and_an_explicit_count_keep_theirs():
    streaming = plan_streaming(CFG, TINY, MeshSpec(12, 8, 6, 8), kv=KVReserve(16, 2))
    assert WaferLLM(CFG, None, streaming).lanes == 2
    assert WaferLLM(CFG, None, plan(CFG, TINY, MeshSpec(16, 16, 16, 16), kv=KVReserve(32, 4)), lanes=2).lanes == 2
