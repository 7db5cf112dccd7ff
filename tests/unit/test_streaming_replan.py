"""A weight-streaming placement around dead cores and links (no Ray): plan_streaming and replan.

- on a healthy mesh the streaming region is the widest, tallest rectangle at the first tile's corner;
- on a damaged one it is the region with the most cores inside one tile that avoids every dead core and dead
  link and holds the streaming state (checked against every rectangle of small meshes);
- a core's share of that state never grows with the region's columns (what the planner's search relies on);
- replan moves a broken streaming region whole (mode "fresh", every layer's K/V, no weights: they stay off
  the wafer), leaves a healthy one where it is, and the re-planned placement decodes the reference's tokens;
- when no region is left, the PlanError says so in streaming terms: what died, the largest region left, the
  region it would take.
"""

from __future__ import annotations

import random

import pytest

from waferrt.core.mesh import Coord, MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode import layout as dl
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, PlanError, PlanOptions, replan, violations
from waferrt.scheduler.budget import kv_bytes
from waferrt.scheduler.placement import plan_streaming, stream_bytes, streaming_mesh
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

CFG = tiny_config()
KV = KVReserve(16, 3)
SMALL_KV = KVReserve(4, 1)  # regions of 3x8, 4x6, 5x5 ... 11x2 cores hold it: many shapes to choose from


def _free(r: Region, mesh: MeshSpec, links) -> bool:
    return not any(r.contains(c) for c in mesh.dead) and not any(r.contains(a) and r.contains(b) for a, b in links)


def _best_by_hand(mesh: MeshSpec, kv: KVReserve, links) -> Region | None:
    """Every rectangle inside one tile, free and holding the state: the most cores, the widest, the first tile,
    the top-left."""
    found = []
    for t in mesh.tiles():
        tile = mesh.tile_region(t)
        for w in range(1, min(tile.w, CFG.dim) + 1):
            for h in range(1, min(tile.h, dl.max_layer_rows(CFG)) + 1):
                need = stream_bytes(CFG, Region(0, 0, w, h), kv.tokens, kv.requests, "float32")
                if need is None or need > TINY.sram_bytes:
                    continue
                for y in range(tile.y0, tile.y1 - h + 1):
                    for x in range(tile.x0, tile.x1 - w + 1):
                        r = Region(x, y, w, h)
                        if _free(r, mesh, links):
                            found.append(((-w * h, -w, t.tx, t.ty, y, x), r))
    return min(found, key=lambda f: f[0])[1] if found else None


@pytest.mark.parametrize("mesh", [MeshSpec(3, 8, 3, 8), MeshSpec(6, 8, 3, 8), MeshSpec(6, 8, 6, 8),
                                  MeshSpec(16, 16, 8, 8), MeshSpec(20, 12, 9, 10)], ids=str)
def test_a_healthy_mesh_gets_the_first_tiles_widest_tallest_region(mesh):
    p = plan_streaming(CFG, TINY, mesh, kv=KV)
    want = Region(0, 0, min(mesh.tile_w, mesh.width, CFG.dim), min(mesh.tile_h, mesh.height, dl.max_layer_rows(CFG)))
    assert p.embed == want and set(p.layers) == {want} and violations(p) == ()


@pytest.mark.parametrize("seed", range(40))
def test_the_region_avoids_the_dead_and_has_the_most_cores(seed):
    rng = random.Random(seed)
    mesh = rng.choice([MeshSpec(6, 8, 3, 8), MeshSpec(8, 8, 8, 8), MeshSpec(13, 9, 7, 6), MeshSpec(11, 10, 6, 10)])
    cores = list(mesh.region.cores())
    dead = frozenset(rng.sample(cores, rng.randrange(0, 6)))
    links = frozenset((c, Coord(c.x + 1, c.y)) for c in rng.sample(cores, rng.randrange(0, 4)) if c.x + 1 < mesh.width)
    mesh = mesh.with_dead(dead)
    want = _best_by_hand(mesh, SMALL_KV, links)
    if want is None:
        with pytest.raises(PlanError, match="weight streaming: (with .* dead, )?no region"):
            plan_streaming(CFG, TINY, mesh, kv=SMALL_KV, options=PlanOptions(dead_links=links))
        return
    p = plan_streaming(CFG, TINY, mesh, kv=SMALL_KV, options=PlanOptions(dead_links=links))
    assert p.embed == want and violations(p) == () and p.dead_links == links
    assert len(mesh.tiles_of(p.embed)) == 1 and _free(p.embed, mesh, links)


def test_a_dead_core_or_link_in_the_first_tile_moves_the_region():
    two = MeshSpec(6, 8, 3, 8)
    assert plan_streaming(CFG, TINY, two.with_dead({Coord(1, 0)}), kv=KV).embed == Region(3, 0, 3, 8)
    link = frozenset({(Coord(0, 3), Coord(1, 3))})
    assert plan_streaming(CFG, TINY, two, kv=KV, options=PlanOptions(dead_links=link)).embed == Region(3, 0, 3, 8)
    wide = MeshSpec(6, 8, 6, 8)  # one tile, wider than the region needs: a smaller region inside it
    assert plan_streaming(CFG, TINY, wide.with_dead({Coord(1, 0)}), kv=KV).embed == Region(0, 1, 6, 7)
    assert plan_streaming(CFG, TINY, wide, kv=KV, options=PlanOptions(dead_links=link)).embed == Region(1, 0, 5, 8)


@pytest.mark.parametrize("config, kv", [(CFG, KV), (CFG, SMALL_KV), (SMOLLM2_135M, KVReserve(512, 8))],
                         ids=["tiny", "tiny-small-kv", "smollm2"])
def test_a_cores_share_never_grows_with_the_columns(config, kv):
    for h in range(1, dl.max_layer_rows(config) + 1, 3):
        needs = [stream_bytes(config, Region(0, 0, w, h), kv.tokens, kv.requests, "float32")
                 for w in range(1, config.dim + 1, 7)]
        assert None not in needs and needs == sorted(needs, reverse=True)


def test_no_room_says_what_died_and_what_it_would_take():
    mesh = streaming_mesh(CFG, TINY, KV)  # the smallest: one 3x8 tile, the region is all of it
    with pytest.raises(PlanError) as e:
        plan_streaming(CFG, TINY, mesh.with_dead({Coord(1, 0)}), kv=KV)
    text = str(e.value)
    assert "weight streaming: with core (x=1, y=0) dead" in text and "the largest, [0:3)x[1:8), needs" in text
    assert "a region of 3x8 cores" in text and "a mesh with another tile" in text


def test_replan_moves_a_broken_streaming_region_whole_and_it_decodes_the_reference():
    p = plan_streaming(CFG, TINY, MeshSpec(12, 8, 6, 8), kv=KV)
    rp = replan(p, frozenset({Coord(1, 2)}))
    new = rp.placement
    assert rp.mode == "fresh" and new.streaming and violations(new) == ()
    assert new.embed == Region(6, 0, 6, 8) and set(new.layers) == {new.embed} and Coord(1, 2) in new.mesh.dead
    assert rp.broken == ("embed+layers 0-2+head",) and rp.moved == rp.broken
    kv = kv_bytes(CFG, p.kv_tokens, KV.requests, "float32")
    assert [(m.tensor, m.layer, m.src, m.dst, m.nbytes) for m in rp.moves] == \
        [("kv", i, p.embed, new.embed, kv) for i in range(CFG.n_layers)]  # the weights stay in MemoryX
    link = (Coord(7, 5), Coord(7, 6))  # 6 rows above it hold more cores than 4 columns beside it, or tile 0's
    again = replan(new, dead_links=frozenset({link}))
    assert again.placement.embed == Region(6, 0, 6, 6) and again.placement.dead_links == {link}
    weights, sampler = synthetic_llama(CFG, seed=0), Sampler(temperature=0.8, seed=3)
    requests = [GenRequest((5, 9, 2), 5), GenRequest((7,), 4)]
    out, _ = LocalDecoder(CFG, weights, again.placement).generate(requests, sampler)
    assert [c.tokens for c in out] == [c.tokens for c in generate_reference(CFG, weights, requests, sampler)[0]]


def test_replan_leaves_a_streaming_region_the_failure_misses_and_says_when_none_is_left():
    p = plan_streaming(CFG, TINY, MeshSpec(6, 8, 3, 8), kv=KV)
    rp = replan(p, frozenset({Coord(4, 4)}))
    assert rp.mode == "unchanged" and rp.placement.embed == p.embed and rp.moves == () and rp.moved == ()
    with pytest.raises(PlanError, match=r"cannot re-plan the streaming region \[0:3\)x\[0:8\) that the failure "
                                        r"breaks: weight streaming: with core \(x=1, y=1\), core \(x=4, y=4\) dead, "
                                        r"no region"):
        replan(rp.placement, frozenset({Coord(1, 1)}))
