"""The decode's shortcuts for speed give what the long way gives (issue 18, speed).

- ``MeshSpec.in_tiles``: the same mesh in at most N tiles, every old tile (so every region planned inside
  one) inside one new tile -- `waferrt generate` runs its default mesh so, one tile per core;
- ``Chunks`` split/join as a pad and a reshape when the chunks lie in order, equal to the gather/scatter;
- the RoPE angles a layer takes from its table, equal to the angles computed for the positions at hand;
- ``LineComm.book_allreduce`` worked out once per size: a ledger books what the closed form says, every time;
- a lane's K/V rows read as a view (evenly spaced slots), the same rows as the gather.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from waferrt.core.cost import allreduce_cost, on_lines
from waferrt.core.layout import Chunks
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import WSE2
from waferrt.decode.cost import Decoding
from waferrt.decode.pack import pack_layer, rope_tables
from waferrt.decode.shards import LayerShard
from waferrt.fabric.comm import LineComm, Span
from waferrt.model import synthetic_llama, tiny_config

fast = settings(max_examples=60, deadline=None, database=None)


@st.composite
def meshes(draw):
    w, h = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    return MeshSpec(w, h, draw(st.integers(1, w)), draw(st.integers(1, h)))


@fast
@given(meshes(), st.integers(1, 9))
def test_in_tiles_merges_whole_tiles_down_to_the_count(mesh, most):
    cut = mesh.in_tiles(most)
    assert (cut.width, cut.height, cut.dead) == (mesh.width, mesh.height, mesh.dead)
    assert len(cut.tiles()) <= most or len(cut.tiles()) == 1
    if len(mesh.tiles()) <= most:
        assert cut == mesh
    for t in mesh.tiles():  # every old tile inside one new tile: a region inside one stays so
        assert len(cut.tiles_of(mesh.tile_region(t))) == 1


def test_the_default_mesh_on_two_cores_is_two_tiles_of_whole_columns():
    assert MeshSpec(174, 128, 87, 64).in_tiles(2) == MeshSpec(174, 128, 87, 128)
    assert MeshSpec(174, 128, 87, 64).in_tiles(1) == MeshSpec(174, 128, 174, 128)
    assert MeshSpec(174, 128, 87, 64).in_tiles(4) == MeshSpec(174, 128, 87, 64)


@fast
@given(st.integers(1, 300), st.integers(1, 12), st.sampled_from([1, 2]), st.integers(1, 3))
def test_chunks_in_order_split_and_join_as_the_gather_does(n, parts, granule, batch):
    n *= granule
    if parts > n // granule:
        return
    chunks = Chunks(n, parts, granule)
    v = np.random.default_rng(n).standard_normal((batch, n)).astype(np.float32)
    general = Chunks(n, parts, granule)
    general.in_order = False  # the gather and scatter every layout takes
    split = chunks.split(v)
    assert np.array_equal(split, general.split(v)) and split.shape == (batch, *chunks.index.shape)
    assert np.array_equal(chunks.join(split), v) and np.array_equal(general.join(split), v)
    assert chunks.join(split).flags.c_contiguous


def test_evenly_cut_chunks_take_the_short_way():
    assert Chunks(49152, 48).in_order and Chunks(576, 16).in_order
    assert not Chunks(576, 29).in_order  # 25 chunks of 20, then 4 of 19: padding inside


def _shard(region: Region, ledger: Ledger) -> LayerShard:
    config = tiny_config()
    weights = synthetic_llama(config, seed=1)
    arrays = pack_layer(config, weights.layers[0], region, "float32")
    return LayerShard(Decoding(config), region, arrays, (2, 16), ledger)


def test_rope_from_the_table_is_the_angles_of_the_positions():
    region = Region(0, 0, 4, 4)
    shard = _shard(region, Ledger(WSE2))
    inv, _ = rope_tables(shard.config, shard.rows)
    for poss in (np.array([0, 3, 7]), np.array([15, 2]), np.array([40])):  # 40: beyond the cache's table
        ang = poss[:, None, None] * inv[None]  # the angles as the reference computes them, in float64
        cos, sin = shard._rope(poss)
        assert np.array_equal(cos, np.cos(ang).astype(np.float32)[:, :, None])
        assert np.array_equal(sin, np.sin(ang).astype(np.float32)[:, :, None])


@given(st.lists(st.tuples(st.sampled_from(["ktree", "ring", "pipeline", "chain"]), st.integers(1, 3),
                          st.integers(1, 64), st.booleans()), min_size=1, max_size=12))
@fast
def test_an_allreduce_booked_again_books_its_closed_form_again(calls):
    region = Region(0, 0, 6, 5)
    for axis in ("x", "y"):
        ledger = Ledger(WSE2)
        comm = LineComm(axis, Span.of(region), ledger, fast=True)
        want = []
        with ledger.op("all"):
            for algo, k, values, replicated in calls + calls:
                comm.book_allreduce(algo, k, values, replicated)
                nbytes = (values if replicated else values / comm.lines) * 4
                want.append(on_lines(allreduce_cost(WSE2, algo, comm.n, nbytes, k), comm.lines))
        got = ledger.by_op["all"]
        assert got.messages == sum(c.messages for c in want) and got.link_bytes == round(
            sum(c.link_bytes for c in want))
        assert got.stages == sum(c.stages for c in want)
        assert abs(got.cycles - sum(c.cycles for c in want)) <= 1e-9 * max(1.0, got.cycles)


@fast
@given(st.lists(st.integers(0, 11), min_size=1, max_size=8))
def test_slots_read_as_a_slice_are_the_same_rows(slots):
    from waferrt.decode.kvcache import as_slice

    cache = np.arange(12 * 5).reshape(12, 5)
    rows = np.array(slots)
    assert np.array_equal(cache[as_slice(rows)], cache[rows])
    if len(slots) > 1 and len(set(np.diff(slots))) == 1 and slots[1] > slots[0]:
        assert isinstance(as_slice(rows), slice)  # evenly spaced: a view
