"""Re-planning around newly dead cores and links: it avoids them, and moves only what it must."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sched_placement import FAST, SPEC, WSE2, _plan_or_none, kvs, meshes, models

from waferrt.core.mesh import Coord, Extent, MeshSpec
from waferrt.decode import layout as dl
from waferrt.model.config import SMOLLM2_135M, LlamaConfig
from waferrt.scheduler import KVReserve, PlanError, default_mesh, plan, plan_report, replan, violations
from waferrt.scheduler.budget import kv_bytes, tensor_bytes
from waferrt.scheduler.geometry import tiles_spanned
from waferrt.scheduler.search import smallest_mesh
from waferrt.scheduler.types import Workload


def _check(p, rp, dead=frozenset(), links=frozenset()):
    new = rp.placement
    assert violations(new) == ()
    if all(tiles_spanned(p.mesh, r) == 1 for _, r in p.regions()):  # the decode runs each region in one tile
        assert [r for _, r in new.regions() if tiles_spanned(new.mesh, r) > 1] == []
    assert new.mesh.dead == p.mesh.dead | dead and new.dead_links == p.dead_links | links
    hit = {name for name, r in p.regions()
           if any(r.contains(c) for c in dead) or any(r.contains(a) and r.contains(b) for a, b in links)}
    assert set(rp.broken) == hit
    old, now = dict(p.regions()), dict(new.regions())
    changed = {name for name in old if old[name] != now[name]}
    assert set(rp.moved) == changed
    if rp.mode == "unchanged":
        assert not hit and not changed and new.layers == p.layers
    if rp.mode == "local":
        assert hit <= changed
        for name in changed - hit:  # only the embedding's new region may displace a healthy layer
            assert "embed" in hit and old[name].intersect(new.embed) is not None
    return changed


def _check_moves(p, rp):
    sizes = tensor_bytes(p.config, p.dtype)
    for m in rp.moves:
        name = "embed" if m.layer is None else f"layer {m.layer}"
        assert m.src == dict(p.regions())[name] and m.dst == dict(rp.placement.regions())[name]
        kv = kv_bytes(p.config, p.kv_tokens, p.kv.requests, p.dtype)
        assert m.nbytes == (kv if m.tensor == "kv" else sizes[m.tensor])
    layers = [m.layer for m in rp.moves if m.layer is not None]
    assert len(layers) == (len(dl.LAYER_WEIGHTS) + 1) * len(set(layers))


@FAST
@given(models(), meshes(dead=False), kvs, st.data())
def test_replan_avoids_dead_cores_and_moves_only_what_it_must(config, mesh, kv, data):
    p = _plan_or_none(config, mesh, kv)
    if p is None:
        return
    used = sorted(c for _, r in p.regions() for c in r.cores()) + sorted(p.spare)
    dead = frozenset(data.draw(st.lists(st.sampled_from(used), max_size=5)))
    ends = data.draw(st.lists(st.tuples(st.sampled_from(used), st.booleans()), max_size=2))
    links = frozenset((c, Coord(c.x + east, c.y + (not east))) for c, east in ends
                      if c.x + east < mesh.width and c.y + (not east) < mesh.height)
    try:
        rp = replan(p, dead, links)
    except PlanError as e:
        assert "cannot re-plan" in str(e)
        return
    _check(p, rp, dead, links)
    _check_moves(p, rp)


def test_dead_spare_core_changes_nothing_but_the_spare_set():
    p = plan(SMOLLM2_135M, WSE2, MeshSpec(174, 128, 87, 64), kv=KVReserve(512, 8))
    core = min(p.spare)
    rp = replan(p, frozenset({core}))
    assert rp.mode == "unchanged" and rp.moves == () and core not in rp.placement.spare
    _check(p, rp, frozenset({core}))


def test_dead_link_inside_a_layer_moves_that_layer_only():
    p = plan(SMOLLM2_135M, WSE2, MeshSpec(174, 128, 87, 64), kv=KVReserve(512, 8))
    r = p.layers[5]
    link = (Coord(r.x0 + 3, r.y0 + 2), Coord(r.x0 + 3, r.y0 + 3))
    rp = replan(p, dead_links=frozenset({link}))
    assert rp.mode == "local" and rp.moved == ("layer 5",)
    _check(p, rp, links=frozenset({link}))
    _check_moves(p, rp)


@pytest.mark.parametrize("seed", [0, 1, 11, 54])  # 54 needs a fresh plan: its spares died too
def test_smollm2_default_mesh_survives_10_random_dead_cores(seed):
    kv = KVReserve(512, 8)
    p = plan(SMOLLM2_135M, WSE2, default_mesh(SMOLLM2_135M, WSE2, kv), kv=kv)
    rng = random.Random(seed)
    dead = frozenset(Coord(rng.randrange(p.mesh.width), rng.randrange(p.mesh.height)) for _ in range(10))
    rp = replan(p, dead)
    assert rp.mode in ("local", "fresh") and plan_report(rp.placement).sram_max <= WSE2.sram_bytes
    _check(p, rp, dead)
    _check_moves(p, rp)


def test_no_room_left_says_why():
    small = LlamaConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, n_kv_heads=1, hidden_dim=32,
                        max_seq_len=64)
    kv = KVReserve(8, 1)
    mesh = smallest_mesh(Workload(small, kv), SPEC, Extent(8, 8))
    p = plan(small, SPEC, mesh, kv=kv)
    checkerboard = frozenset(c for c in mesh.region.cores() if (c.x + c.y) % 2 == 0)  # no 2 live neighbours
    with pytest.raises(PlanError, match="cannot re-plan: the failure breaks embed, layer 0.*does not fit"):
        replan(p, checkerboard)
    with pytest.raises(PlanError, match="outside"):
        replan(p, frozenset({Coord(mesh.width, 0)}))
