"""Telling a straggler by its pace (actors.watch.Watch.slow): against the median tile's, and against its own
fastest pace so far -- so that several tiles slowing at once are still found, and a tile that was always a
little slower (the head's) is not. No Ray: the paces are fed as the beats would carry them."""

from __future__ import annotations

from waferrt.actors.watch import Watch
from waferrt.core.mesh import TileId

TILES = [TileId(x, y) for y in range(2) for x in range(3)]


def _watch(paces: dict[TileId, float]) -> Watch:
    w = Watch({t: None for t in TILES}, None, 4.0)
    w.note_paces(paces)
    return w


def test_one_slow_tile_is_behind_the_median():
    w = _watch({t: 1e-3 for t in TILES})
    w.note_paces({TILES[4]: 0.02})
    assert w.slow() == [TILES[4]]


def test_many_slow_tiles_are_behind_their_own_fastest_pace():
    w = _watch({t: 1e-3 for t in TILES})
    w.note_paces({t: 0.03 for t in TILES[:4]})  # the lower median is a slow one now
    assert sorted(w.slow()) == sorted(TILES[:4])


def test_a_steady_tile_is_not_a_straggler_and_a_restarted_one_starts_afresh():
    w = _watch({**{t: 1e-3 for t in TILES}, TILES[0]: 2e-3})  # the head's tile: a little slower, always
    assert w.slow() == []
    w.note_paces({TILES[1]: 0.03})
    w.reset([TILES[1]])  # restarted: its pace is not known yet, its old fastest pace no yardstick
    w.note_paces({TILES[1]: 0.0011})
    assert w.slow() == []


def test_a_tile_reports_the_pace_of_its_slowest_stage():
    """A slow core holds up only the stage whose region holds it: the tile's pace (what its beats carry) is
    that stage's, not an average that the tile's other stages would dilute (LocalDecoder: no Ray)."""
    from waferrt.core.mesh import MeshSpec
    from waferrt.core.spec import TINY
    from waferrt.decode.stage import StageKind
    from waferrt.faults import Straggler
    from waferrt.faults.state import FaultState
    from waferrt.model import Sampler, synthetic_llama, tiny_config
    from waferrt.scheduler import KVReserve, plan
    from waferrt.serving import GenRequest, LocalDecoder

    config = tiny_config()
    p = plan(config, TINY, MeshSpec(16, 8, 16, 8), kv=KVReserve(16, 1))  # one tile: 3 layers on it
    dec = LocalDecoder(config, synthetic_llama(config, seed=0), p)
    (tile,) = p.mesh.tiles()
    prog = dec.programs[tile]
    prog.faults = FaultState(tile, p.mesh.tile_region(tile))
    prog.faults.arm(Straggler(core=next(p.layers[1].cores()), delay=0.05), 0)
    dec.generate([GenRequest((3, 4), 4)], Sampler())
    layer_paces = [prog.paces[s] for s, st in enumerate(prog.stages) if st.kind is StageKind.LAYER]
    assert prog.pace == max(layer_paces) >= 0.05 > sorted(layer_paces)[0] * 5, layer_paces
