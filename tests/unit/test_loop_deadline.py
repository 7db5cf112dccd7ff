"""The head's deadline for a silent pipeline (waferrt.serving.loop): a machine that slows every tile alike -- a
loaded host -- stretches it, since the head's own stage runs time the round trip; a dead tile still trips it.
No Ray: every tile's loop in a thread over a LoopFabric, as LocalDecoder runs them."""

from __future__ import annotations

import os
import queue
import threading

import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.fabric.links import FabricTimeout
from waferrt.faults import Straggler
from waferrt.faults.state import FaultState
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, LocalDecoder, loop
from waferrt.serving.engine import HeadEngine, Submission
from waferrt.serving.loop import Pace, crowding, run_tile

CONFIG = tiny_config()


def test_the_limit_is_the_first_deadline_times_the_crowding_then_the_pace_of_arrivals_times_the_load():
    pace = Pace(60.0)
    assert pace.limit(1.0, 1.0) == 60.0  # nothing arrived: the first deadline
    assert pace.limit(2.0, 5.0) == 600.0  # a prefill of two micro-batches' work on a machine 5x crowded
    pace.arrived(0.1)
    assert pace.limit(1.0, 5.0) == 10.0  # 50 x 0.1 s = 5 s, below the 10 s floor; the gaps measured it
    pace.arrived(2.1)  # EMA: 0.9 x 0.1 + 0.1 x 2.1 = 0.3 s -> 50 x 0.3 = 15 s
    assert pace.limit(3.0, 4.0) == pytest.approx(45.0)


@pytest.mark.parametrize(("loadavg", "cpus", "want"), [(10.0, 2, 5.0), (1.0, 2, 1.0), (3.0, 4, 1.0), (6.0, 4, 1.5)])
def test_crowding_is_the_load_average_per_core_and_at_least_one(monkeypatch, loadavg, cpus, want):
    monkeypatch.setattr(os, "getloadavg", lambda: (loadavg, 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert crowding() == want


def _run(dead: bool, first: float) -> BaseException | None:
    """Every tile slower by 0.1 s per stage (a tile straggler on each: a round trip takes 0.5 s at least); one
    request of 3 tokens; `dead`: the tile of the last layer never runs its loop. Returns the head's error, or
    None when the request finished."""
    placement = plan(CONFIG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(16, 1))
    dec = LocalDecoder(CONFIG, synthetic_llama(CONFIG, seed=0), placement)
    tiles = dec.setup.stage_tiles()
    assert len(tiles) == 5 and tiles[-2] != tiles[0], tiles  # embedding, 3 layers, head: the chain leaves the head
    for t, program in dec.programs.items():
        program.faults = FaultState(t, placement.mesh.tile_region(t))
        program.faults.arm(Straggler(t, 0.1), 0)
    engine, control, out, stop = HeadEngine.of(dec.setup, 1), queue.Queue(), queue.Queue(), threading.Event()
    control.put(("submit", Submission(0, GenRequest((3, 4), 3), Sampler())))
    others = [t for t in dec.programs if t != tiles[0] and not (dead and t == tiles[-2])]
    threads = [threading.Thread(target=run_tile, args=(dec.programs[t], None, control, out.put, stop), daemon=True)
               for t in others]
    for th in threads:
        th.start()
    error = None
    try:
        run_tile(dec.programs[tiles[0]], engine, control, lambda ev: engine.idle and stop.set(), stop, first)
    except FabricTimeout as e:
        error = e
    stop.set()
    for th in threads:
        th.join(10)
    return error


def test_a_crowded_machine_stretches_the_first_deadline(monkeypatch):
    """The first pass takes 0.5 s at least, over the 0.2 s first deadline; a machine 10x crowded allows 2 s."""
    monkeypatch.setattr(loop, "crowding", lambda: 10.0)
    assert _run(dead=False, first=0.2) is None


def test_a_dead_tile_still_trips_the_stretched_deadline(monkeypatch):
    monkeypatch.setattr(loop, "crowding", lambda: 10.0)
    error = _run(dead=True, first=0.2)
    assert isinstance(error, FabricTimeout) and "in flight for 2s and nothing came back" in str(error)
