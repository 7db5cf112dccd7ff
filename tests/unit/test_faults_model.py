"""The pure floors of fault injection: faults as data, a tile's FaultState, the wire's checksum, the log, and
how a request resumes after a fault (its tokens and its RNG where they were)."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from waferrt.core.mesh import Coord, Dir, MeshSpec, Region, TileId
from waferrt.decode.schedule import Item, StageRun, flow_seconds
from waferrt.fabric.loop import LoopFabric
from waferrt.faults import (
    CoreFailure,
    Corrupt,
    FaultPlan,
    LinkFailure,
    NodeLoss,
    PayloadCorrupt,
    Straggler,
    Targets,
    TileCrash,
    Trigger,
)
from waferrt.faults.events import FaultLog
from waferrt.faults.model import border_links, fault_dict, fault_from, fault_tiles
from waferrt.faults.state import FaultState
from waferrt.faults.wire import checksum, flip
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.serving import Completion, GenRequest, generate_reference
from waferrt.serving.recovery import resume

MESH = MeshSpec(8, 4, 4, 4)
ALL = (CoreFailure((1, 2), Trigger(step=3)), LinkFailure((3, 1), (4, 1), Trigger(message=2)),
       Corrupt((3, 0), (4, 0), 2, Trigger(seconds=0.5)), Straggler((1, 0), 0.01, Trigger(rate=0.25)),
       TileCrash((0, 0)), NodeLoss(1, Trigger(step=7)), Straggler(core=(5, 2), delay=0.02, when=Trigger(step=2)))


def test_a_plan_round_trips_through_json_and_yaml(tmp_path):
    plan = FaultPlan(ALL, seed=9, policy="fail-fast")
    for name in ("plan.json", "plan.yaml"):
        plan.save(tmp_path / name)
        assert FaultPlan.load(tmp_path / name) == plan
    assert all(fault_from(fault_dict(f)) == f for f in ALL) and len(set(ALL)) == 7  # hashable values
    assert "tile" not in fault_dict(ALL[-1]) and fault_dict(ALL[-1])["core"] == [5, 2]


def test_the_same_seed_draws_the_same_plan():
    a, b = (FaultPlan.random(4, 30, MESH, steps=12) for _ in range(2))
    assert a == b and a != FaultPlan.random(5, 30, MESH, steps=12)
    assert {f.kind for f in a.faults} == {"core", "link", "corrupt", "straggler", "tile"}  # node: needs 2 nodes
    assert all(1 <= f.when.step <= 12 for f in a.faults)
    assert all(MESH.tile_of(f.a) != MESH.tile_of(f.b) for f in a.faults if f.kind == "corrupt")
    slow = FaultPlan.random(4, 20, Targets(MESH, {Coord(1, 1)}), kinds=("straggler",)).faults
    assert {f.core for f in slow} == {None, Coord(1, 1)}  # a slow tile, or one slow core of the decode's
    assert {f.node for f in FaultPlan.random(1, 20, Targets(MESH, nodes=3), kinds=("node",)).faults} <= {1, 2}


@pytest.mark.parametrize("bad,match", [
    (lambda: LinkFailure((0, 0), (2, 0)), "one N/E/S/W hop"), (lambda: Straggler((0, 0), 0), "positive delay"),
    (lambda: Straggler(delay=0.01), "a tile or a core"), (lambda: Straggler((0, 0), 0.01, core=(1, 1)), "one of them"),
    (lambda: Trigger(rate=2), r"rate in \[0, 1\]"), (lambda: FaultPlan(policy="maybe"), "tolerant"),
    (lambda: Corrupt((0, 0), (0, 1), 0), "at least 1 bit"),
    (lambda: fault_tiles(Corrupt((0, 0), (1, 0)), MESH), "lies inside"),
    (lambda: FaultPlan.from_dict({"faults": [{"kind": "core"}]}), "not a fault plan")])
def test_bad_faults_say_what_is_wrong(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_border_links_cross_tiles():
    links = border_links(MESH)
    assert len(links) == 2 * 4 and all(MESH.tile_of(a) != MESH.tile_of(b) and a.hops_to(b) == 1 for a, b in links)
    assert border_links(MESH, {(TileId(0, 0), Dir.E)}) == [(Coord(3, y), Coord(4, y)) for y in range(4)]


def test_a_tiles_faults_fire_at_their_trigger_once():
    fired = []
    s = FaultState(TileId(0, 0), MESH.tile_region(TileId(0, 0)), fired.append)
    s.arm(CoreFailure((1, 2), Trigger(step=3)), 0)
    s.arm(LinkFailure((0, 0), (1, 0), Trigger(step=1)), 1)
    s.tick(10)
    s.tick(10)  # the same micro-batch again (another segment on this tile): not a new step
    assert [f.index for f in fired] == [1] and s.hit(Region(0, 0, 2, 1)) == LinkFailure((0, 0), (1, 0))
    s.tick(11)
    assert [f.index for f in fired] == [1]  # two steps so far
    s.tick(12)
    assert [f.index for f in fired] == [1, 0] and fired[1].step == 3 and s.dead_cores == {Coord(1, 2)}
    assert s.hit(Region(0, 0, 4, 4)) == CoreFailure((1, 2)) and s.hit(Region(2, 0, 2, 4)) is None
    s.tick(13)
    assert len(fired) == 2 and s.armed == []


def test_a_slow_core_holds_up_only_the_regions_that_hold_it():
    s = FaultState(TileId(1, 0), MESH.tile_region(TileId(1, 0)))
    s.arm(Straggler(core=(5, 2), delay=0.02, when=Trigger(step=1)), 0)
    s.arm(Straggler((1, 0), 0.01, Trigger(step=2)), 1)
    assert fault_tiles(Straggler(core=(5, 2), delay=0.02), MESH) == [TileId(1, 0)]
    s.tick(1)
    assert s.delay_in(Region(4, 0, 4, 4)) == 0.02 and s.delay_in(Region(6, 0, 2, 4)) == 0 and not s.quiet
    s.tick(2)  # the whole tile slows down too
    assert s.delay_in(Region(4, 0, 4, 4)) == 0.03 and s.delay_in(Region(6, 0, 2, 4)) == 0.01


def test_corrupt_fires_with_the_message_it_flips_and_rates_follow_the_seed():
    s = FaultState(TileId(0, 0), MESH.tile_region(TileId(0, 0)))
    s.arm(Corrupt((3, 0), (4, 0), 3, Trigger(message=2)), 0)
    assert s.on_send(Dir.S) is None and s.on_send(Dir.E) is None  # other link; first message on it
    bits, rng = s.on_send(Dir.E)
    assert bits == 3 and [f.index for f in s.fired] == [0] and s.on_send(Dir.E) is None

    def steps_until_fired(seed: int) -> int:
        st = FaultState(TileId(0, 0), MESH.tile_region(TileId(0, 0)))
        st.arm(Straggler((0, 0), 0.01, Trigger(rate=0.2)), 3, seed)
        return next(i for i in range(1, 500) if st.tick(i))

    assert steps_until_fired(7) == steps_until_fired(7)
    assert len({steps_until_fired(seed) for seed in range(8)}) > 1


def test_a_checksum_catches_any_flip_and_the_fabric_never_delivers_it():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, 2], np.int64)]
    for seed in range(20):
        bad = flip(arrays, 1 + seed % 3, random.Random(seed))
        assert checksum(bad) != checksum(arrays)
    np.testing.assert_array_equal(arrays[0], np.arange(12, dtype=np.float32).reshape(3, 4))  # copies flipped
    fabric = LoopFabric(MESH, timeout=2.0)
    a, b = fabric.links(TileId(0, 0)), fabric.links(TileId(1, 0))
    a.corrupt = lambda d: (2, random.Random(1)) if d == Dir.E else None
    a.send(Dir.E, "t", arrays)
    with pytest.raises(PayloadCorrupt, match="checksum"):
        b.recv(Dir.W, "t")
    a.corrupt = None
    a.send(Dir.E, "u", arrays)
    np.testing.assert_array_equal(b.recv(Dir.W, "u")[0], arrays[0])


def test_the_log_says_what_became_of_each_fault():
    log = FaultLog(ALL[:3])
    log.mark_fired(0, 3, 100.0)
    log.mark_detected(log.pending(), "core failed in its region", 100.25)
    log.mark_recovered(log.pending(), "re-planned layer 1", 101.0, 0.002)
    log.mark_fired(1, 1, 102.0)
    assert [e.outcome for e in log.events] == ["recovered", "fired, not detected", "did not fire"]
    assert log.events[0].detected_after_s == pytest.approx(0.25) and log.events[0].recovered_in_s == 0.75
    assert log.events[0].recovered_after_s == pytest.approx(1.0)  # from when it fired, not when it was armed
    assert log.fired() == log.events[:2] and log.detected() == log.recovered() == log.events[:1]
    assert log.pending() == [log.events[1]] and log.unfired() == [log.events[2]]
    assert log.counts() == {"injected": 3, "fired": 2, "detected": 1, "recovered": 1}
    assert log.of_kind(log.events[2].kind) == [log.events[2]]
    assert "detected +s" in log.table() and " 0.25 " in log.table() and " 1.00 " in log.table()
    assert "re-planned layer 1" in log.table() and log.as_dicts()[0]["recovered_modelled_s"] == 0.002


def test_a_resumed_request_gives_the_tokens_of_an_unbroken_run():
    config = tiny_config()
    w = synthetic_llama(config, seed=2)
    requests = [GenRequest((5, 6), 9), GenRequest((7,), 6)]
    sampler = Sampler(temperature=0.9, top_p=0.95, seed=3)
    whole, _ = generate_reference(config, w, requests, sampler)
    out = [Completion((5, 6), whole[0].tokens[:4]), Completion((7,), whole[1].tokens, finish=whole[1].finish)]
    (sub,) = resume(requests, out, sampler)
    assert sub.index == 0 and sub.made == 4 and sub.request.prompt_ids == (5, 6, *whole[0].tokens[:4])
    rng = np.random.default_rng([sampler.seed, 0])
    sampler.skip(rng, sub.made)
    fresh = np.random.default_rng([sampler.seed, 0])
    fresh.random(4)
    assert rng.random() == fresh.random()  # the resumed request draws on from where it was


def test_the_runs_of_an_attempt_a_fault_ended_are_scheduled_in_part():
    r = Region(0, 0, 1, 1)
    runs = [StageRun(0, 0, r, 0, 5.0, (Item(0, 0, True, 5.0),)), StageRun(0, 2, r, 1, 5.0, (Item(0, 0, True, 5.0),))]
    with pytest.raises(ValueError, match="never ran"):
        flow_seconds(runs, 2, 1.0)
    assert flow_seconds(runs, 2, 1.0, partial=True) == 5.0  # stage 1's run was lost with its tile


@pytest.mark.parametrize("w, h, tw, th", [(16, 16, 8, 8), (8, 4, 4, 4), (6, 9, 3, 3)])
def test_a_plan_off_the_mesh_is_refused_naming_the_fault(w, h, tw, th):
    """FaultPlan.check: every core, both ends of every link and every tile lie on the mesh, else a ValueError
    naming the fault's index, kind and where; a plan inside the mesh passes."""
    mesh = MeshSpec(w, h, tw, th)
    inside = FaultPlan((CoreFailure((w - 1, h - 1)), LinkFailure((0, 0), (1, 0)), TileCrash(TileId(0, 0)),
                        Straggler(None, 0.01, core=Coord(0, h - 1)), NodeLoss(1)))
    inside.check(mesh)
    off = [(CoreFailure((w, 0)), f"core (x={w}, y=0) is not on the {w}x{h} mesh"),
           (LinkFailure((0, h - 1), (0, h)), f"core (x=0, y={h}) is not on the {w}x{h} mesh"),
           (TileCrash(TileId(w // tw, 0)), f"tile({w // tw},0) is not a tile of the mesh"),
           (Straggler(None, 0.01, core=Coord(-1, 0)), "core (x=-1, y=0) is not on the")]
    for fault, words in off:
        with pytest.raises(ValueError, match=r"fault 5 \(" + fault.kind + r"\) .*" + re.escape(words)):
            FaultPlan((*inside.faults, fault)).check(mesh)
