"""TEMP's tensor-stream partition on the die grid (waferrt.estimator.die_grid): what each die edge carries under
each layout, worked out by hand, and the step it sets on the temp template (no Ray)."""

from __future__ import annotations

import pytest

from waferrt.core.mesh import Coord, Extent
from waferrt.core.template import DieLinks, template_by_name
from waferrt.core.topology import Topology
from waferrt.core.train_cost import TrainShape
from waferrt.estimator.die_grid import Axis, DieGrid, Layout, link_loads, partition, stream_traffic
from waferrt.estimator.train import TrainJob, tensor_stream
from waferrt.model.zoo import model_by_name

MESH, TORUS = Topology("mesh"), Topology("torus")


def test_a_ring_on_a_line_of_dies_loads_every_edge_twice_as_much_without_the_wrap():
    """4 dies in a line, one ring both ways: each hop carries 3/4 x 1/2 of the data each way. On the mesh both
    closing hops run back over the line, so every directed edge carries 3/8 + 3/8 = 3/4; the torus's wrap
    closes them, 3/8."""
    ring = tuple(Coord(x, 0) for x in range(4))
    mesh, mesh_hop = link_loads(DieGrid(Extent(4, 1), MESH), (ring,))
    torus, torus_hop = link_loads(DieGrid(Extent(4, 1), TORUS), (ring,))
    assert len(mesh) == 6 and set(mesh.values()) == {0.75} and mesh_hop == 3  # 3 -> 0 crosses 3 edges
    assert len(torus) == 8 and set(torus.values()) == {0.375} and torus_hop == 1


def test_a_ring_laid_row_by_row_shares_the_row_edges_a_cycle_does_not():
    """2x2 dies. The cycle (0,0) (1,0) (1,1) (0,1): every hop one edge, 3/8 on each. Row by row, (1,0) -> (0,1)
    goes back along row 0 then up column 0, so every row edge carries two hops' 3/8 = 3/4: contention."""
    grid = DieGrid(Extent(2, 2), MESH)
    cycle = partition(grid, Layout.RING_CYCLE).gather[0]
    assert cycle == ((0, 0), (1, 0), (1, 1), (0, 1))
    loads, hop = link_loads(grid, (cycle,))
    assert set(loads.values()) == {0.375} and len(loads) == 8 and hop == 1
    crowded, hop = link_loads(grid, partition(grid, Layout.RING_ROW_MAJOR).gather)
    assert hop == 2 and max(crowded.values()) == 0.75
    assert sorted(v for e, v in crowded.items() if e.axis is Axis.ROW) == [0.75] * 4
    assert sorted(v for e, v in crowded.items() if e.axis is Axis.COLUMN) == [0.375] * 4


def test_the_layouts_on_six_by_eight_dies():
    grid = DieGrid(Extent(6, 8), MESH)
    cycle = partition(grid, Layout.RING_CYCLE).gather[0]
    assert sorted(cycle) == [(x, y) for x in range(6) for y in range(8)]
    assert all(len(grid.route(a, b)) == 1 for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True))
    rows = partition(grid, Layout.GRID_ROWS)
    assert len(rows.gather) == 8 and len(rows.gather[0]) == 6 and len(rows.reduce) == 6 and len(rows.reduce[0]) == 8
    assert rows.gather[0] == ((0, 0), (2, 0), (4, 0), (5, 0), (3, 0), (1, 0))  # the folded ring: hops of 2 edges
    assert partition(DieGrid(Extent(3, 3), MESH), Layout.RING_CYCLE) is None  # odd x odd dies: no cycle of neighbours
    assert partition(DieGrid(Extent(1, 1), MESH), Layout.GRID_ROWS) is None


def _job() -> TrainJob:
    config, label = model_by_name("smollm2-135m")
    return TrainJob(config, TrainShape(256, 2048), "float16", label)


def test_the_tensor_stream_step_on_temp_by_hand():
    """SmolLM2 (30 layers, dim 576, kv 192, hidden 1536), 256 x 2048 tokens at 2 bytes, 37 passes. X: 3 x 30 x
    524,288 x (3 x 576 + 1536) x 2 = 308,029,685,760 B; Y: 2 x 30 x 524,288 x (3 x 576 + 2 x 192 + 2 x 1536) x 2 =
    326,149,079,040 B. On 2D 8x6 (gather on the die rows), each column's reduce ring carries Y / 6, its busiest
    edge 7/8 of it (a mesh line) = 47.563 GB, the rows' 5/6 x X / 8 = 32.09 GB less. At 4 TB/s: 11.891 ms, plus
    (13,320 x 5 + 8,880 x 7) ring steps of 2 edges at 200 ns = 51.504 ms. The torus halves both: 23.78 GB, 1
    edge a step: 5.945 + 25.752 ms."""
    job, temp = _job(), template_by_name("temp")
    traffic = stream_traffic(job.config, job.shape.tokens, job.dtype, 37)
    assert (traffic.x_bytes, traffic.y_bytes) == (308_029_685_760, 326_149_079_040)
    assert (traffic.x_collectives, traffic.y_collectives) == (13_320, 8_880)
    st = tensor_stream(job, temp)
    assert "37 pass(es)" in st.detail and st.layout.partition.layout is Layout.GRID_ROWS
    assert st.layout.busiest_bytes == pytest.approx(326_149_079_040 / 6 * 7 / 8)
    assert st.breakdown.d2d == pytest.approx(0.0118908 + 0.051504, rel=1e-5)
    torus = tensor_stream(job, temp.with_topology(TORUS))
    assert torus.breakdown.d2d == pytest.approx(0.0059454 + 0.025752, rel=1e-5)
    assert torus.breakdown.compute == st.breakdown.compute  # the dies' kernels are the same


def test_the_topology_and_the_links_move_the_step_only_where_the_links_bind():
    """At 4 TB/s the kernels (0.395 s) hide the die edges on the mesh and the torus alike (the torus's step
    shorter only by its on-die rings' hops, < 0.001%); at 0.05 TB/s the busiest edge binds, and the torus's wraps
    halve it."""
    job, temp = _job(), template_by_name("temp")
    slow = temp.replace(d2d=DieLinks(0.05e12, temp.d2d.latency_s))
    fast = {t: tensor_stream(job, temp.with_topology(t)) for t in (MESH, TORUS)}
    assert fast[MESH].step_s == pytest.approx(fast[TORUS].step_s, rel=1e-5)
    bound = {t: tensor_stream(job, slow.with_topology(t)) for t in (MESH, TORUS)}
    assert bound[MESH].breakdown.bound == "die-to-die"
    assert bound[TORUS].step_s < 0.55 * bound[MESH].step_s
