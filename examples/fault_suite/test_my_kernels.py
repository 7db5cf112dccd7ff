"""A user's fault-injection suite for their own kernels: ``pytest examples/fault_suite``.

The waferrt pytest plugin (installed with waferrt) gives each test a fresh ``wafer`` (the marker below says
which), injects the faults of ``@pytest.mark.faults`` into it (``at_step=N``: as the N-th kernel command
starts), and draws seeded random plans with ``fault_plan``; ``--fault-seed S`` replays a campaign, and a
failing test's report prints the seed to replay it with.
"""

from collections import deque

import numpy as np
import pytest
from fault_tolerant_allreduce import allreduce_2d, ft_allreduce

from waferrt import Coord
from waferrt.faults import CoreFailed, CoreFailure

pytestmark = pytest.mark.wafer(spec="tiny", mesh=(8, 8), tile=(8, 4))  # two tile actors


def _put_blocks(wafer) -> np.ndarray:
    """One 16-float block per core in "x", and "s" for the sums."""
    x = np.random.default_rng(0).standard_normal((8, 8, 16)).astype(np.float32)
    for name in ("x", "s"):
        wafer.dsm.alloc(name, x.shape, split=("y", "x", None))
    wafer.dsm.put("x", x)
    return x


@pytest.mark.faults(CoreFailure((3, 4)), at_step=1)
def test_the_plain_allreduce_names_the_dead_core_and_the_blocks_it_lost(wafer):
    _put_blocks(wafer)
    with pytest.raises(CoreFailed) as e:
        wafer.run(allreduce_2d, src="x", dst="s")
    assert e.value.core == Coord(3, 4)
    assert str(e.value) == (
        "core (x=3, y=4) is dead (needed by ctx.load of 'x' in the kernel's region [0:8)x[0:8); leave the dead out: "
        "ctx.live, ctx.can_send, ctx.dead_cores, where=); its SRAM held "
        "DSM 's' block [row 4, col 3] = s[4:5, 3:4, 0:16], DSM 'x' block [row 4, col 3] = x[4:5, 3:4, 0:16] (lost)")


@pytest.mark.faults(CoreFailure((3, 4)), at_step=2)
def test_the_fault_tolerant_allreduce_survives_a_core_dying_between_two_runs(wafer):
    x = _put_blocks(wafer)
    wafer.run(ft_allreduce, src="x", dst="s")  # command 1: every core alive
    np.testing.assert_allclose(wafer.dsm.get("s"), np.broadcast_to(x.sum((0, 1)), x.shape), atol=1e-4)
    wafer.run(ft_allreduce, src="x", dst="s")  # command 2: core (3, 4) dies as it starts; routed around
    live = np.ones((8, 8), bool)
    live[4, 3] = False
    got = wafer.dsm.get("s", fill=np.nan)
    np.testing.assert_allclose(got[live], np.broadcast_to(x[live].sum(0), got[live].shape), atol=1e-4)
    assert np.isnan(got[4, 3]).all()
    assert [e.outcome for e in wafer.session.log.events] == ["fired, not detected"]  # nothing failed


def _reached(fault_map, w: int, h: int) -> np.ndarray:
    """The living cores that living links join to the first living core (what the tree allreduce sums)."""
    live = [Coord(x, y) for y in range(h) for x in range(w) if fault_map.alive(Coord(x, y))]
    seen, todo = {live[0]}, deque(live[:1])
    while todo:
        c = todo.popleft()
        for n in (Coord(c.x + 1, c.y), Coord(c.x - 1, c.y), Coord(c.x, c.y + 1), Coord(c.x, c.y - 1)):
            if 0 <= n.x < w and 0 <= n.y < h and fault_map.alive(n) and fault_map.link_alive(c, n) and n not in seen:
                seen.add(n)
                todo.append(n)
    out = np.zeros((h, w), bool)
    for c in seen:
        out[c.y, c.x] = True
    return out


def test_random_dead_cores_and_links_are_routed_around(wafer, fault_plan):
    x = _put_blocks(wafer)
    plan = fault_plan(3, kinds=("core", "link"), steps=1)  # seeded: --fault-seed replays it
    with wafer.faults(plan):
        wafer.run(ft_allreduce, src="x", dst="s")
    reached = _reached(wafer.fault_map(), 8, 8)
    got = wafer.dsm.get("s", fill=np.nan)
    np.testing.assert_allclose(got[reached], np.broadcast_to(x[reached].sum(0), got[reached].shape), atol=1e-4)
