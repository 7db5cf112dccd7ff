"""The fast path's top-K (waferrt.decode.topk.record_topk): the row_topk kernel's schedule recorded step by step,
tied to its closed form `topk_cost` and to the kernel itself, pinned by hand, and shown to follow the schedule
(issue 31: costs recorded from what runs, not the closed form booked)."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.cost import Cost, on_lines
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.core.topology import Topology
from waferrt.decode import topk
from waferrt.decode.topk import Round, TopKRow, record_topk, row_topk, topk_cost
from waferrt.fabric.comm import LineComm, Span
from waferrt.fabric.loop import simulate

ROWS = [(1, 8, 2, 4), (2, 8, 2, 4), (4, 3, 1, 2), (5, 6, 3, 10), (8, 16, 2, 64)]  # cores, per core, heads, keep
SPECS = [TINY, TINY.replace(topology=Topology("torus"), full_mesh=(8, 3)),
         TINY.replace(topology=Topology("mesh-switch", 4))]


def recorded(row: TopKRow, lines: int = 2, spec=TINY) -> dict[str, Cost]:
    ledger = Ledger(spec)
    record_topk(LineComm("x", Span.of(Region(0, 0, row.cores, lines)), ledger, fast=True), row)
    return ledger.by_op


def kernel(row: TopKRow, lines: int = 2) -> dict[str, Cost]:
    mesh = MeshSpec(row.cores, lines, row.cores, lines)
    scores = np.random.default_rng(1).standard_normal((lines, row.cores, row.heads, row.per_core)).astype(np.float32)
    return simulate(mesh, TINY, mesh.region, lambda ctx, scores: row_topk(ctx, scores, row.keep), scores=scores)[1]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s.topology))
@pytest.mark.parametrize("shape", ROWS)
def test_the_fast_record_is_the_closed_form(shape, spec):
    row = TopKRow(*shape)
    closed = {k: on_lines(c, 3) for k, c in topk_cost(spec, row).items()}
    got = recorded(row, 3, spec)
    assert {k: c for k, c in closed.items() if c != Cost()} == got


@pytest.mark.parametrize("shape", ROWS[1:4])
def test_the_fast_record_is_what_the_kernel_records(shape):
    row = TopKRow(*shape)
    assert recorded(row) == {k: c for k, c in kernel(row).items() if k in recorded(row)}


def test_the_fast_record_by_hand():
    """4 cores of 3 candidates, 1 head, keep 2, on 2 rows of TINY: each core sifts 3 candidates through a heap of 2
    (ceil(log2 3) = 2 levels): 6 comparisons. Middle core 1: round 1 both chains move (core 0 East, core 3 West),
    round 2 the West one (core 2): 3 sends a row, 6 messages of 8 x 1 x 2 = 16 bytes, 96 link bytes, one hop and
    one stage a round (2 and 2); the middle reads two streams: 2 x 2 comparisons. The multicast from core 1
    reaches core 3 in 2 hops: 3 messages a row, 6 x 16 = 96 bytes."""
    got = recorded(TopKRow(cores=4, per_core=3, heads=1, keep=2))
    sel, merge, bcast = got["topk.select"], got["topk.merge"], got["broadcast"]
    assert sel.flops == 6 and sel.messages == 0
    assert (merge.hops, merge.stages, merge.messages, merge.link_bytes, merge.flops) == (2, 2, 6, 96, 4)
    assert (bcast.hops, bcast.stages, bcast.messages, bcast.link_bytes) == (2, 1, 6, 96)


def test_a_change_to_the_schedule_changes_the_record_and_the_tie_fails(monkeypatch):
    """One chain from core 0 to the last core instead of two towards the middle: no cost code edited, the fast
    record now takes 3 rounds (3 hops, 3 stages) where the closed form says 2 -- and the kernel, running the
    same schedule, records what the fast path records."""
    row = TopKRow(cores=4, per_core=3, heads=1, keep=2)
    closed = on_lines(topk_cost(TINY, row)["topk.merge"], 2)
    assert recorded(row)["topk.merge"] == closed
    monkeypatch.setattr(topk, "merge_rounds", lambda row: [Round(r, True, False) for r in range(1, row.cores)])
    merge = recorded(row)["topk.merge"]
    assert (merge.hops, merge.stages) == (3, 3) and merge != closed
    assert kernel(row)["topk.merge"] == merge
