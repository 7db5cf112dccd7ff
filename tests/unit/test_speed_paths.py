"""The decode's shortcuts for speed give what the long way gives (issue 18, speed).

- ``MeshSpec.in_tiles``: the same mesh in at most N tiles, every old tile (so every region planned inside
  one) inside one new tile -- `waferrt generate` runs its default mesh so, one tile per core;
- ``Chunks`` split/join as a pad and a reshape when the chunks lie in order, equal to the gather/scatter;
- the RoPE angles a layer takes from its table, equal to the angles computed for the positions at hand;
- ``LineComm.book_allreduce`` worked out once per size: a ledger books what the closed form says, every time;
- a lane's K/V rows read as a view (evenly spaced slots), the same rows as the gather;
- RoPE in three operations (``shards.rotate``), bit for bit the reference's ``apply_rope``;
- ``Ledger.replay``: bookings replayed from their first sum are what booking them again books.
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
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import pack_layer, rope_tables
from waferrt.decode.shards import Angles, Items, LayerShard, rotate
from waferrt.fabric.comm import LineComm, Span
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.reference import apply_rope

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
    return LayerShard(Decoding(config), region, arrays, KVCapacity(2, 16), ledger)


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


@fast
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31))
def test_rotate_is_apply_rope_bit_for_bit(batch, rows, pairs, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, rows, 7, 2 * pairs)).astype(np.float32)[:, :, :5]  # a slice, as q|k of qkv
    cos, sin = (rng.standard_normal((batch, rows, 1, pairs)).astype(np.float32) for _ in "cs")
    cos2, sin2 = np.repeat(cos, 2, axis=-1), np.stack([-sin, sin], axis=-1).reshape(batch, rows, 1, -1)
    assert np.array_equal(rotate(x, Angles(cos2, sin2)), apply_rope(x, cos, sin))


def test_the_items_rope_tables_are_the_layers_angles_pair_by_pair():
    shard = _shard(Region(0, 0, 4, 4), Ledger(WSE2))
    poss = np.array([3, 0, 40])
    cos, sin = shard._rope(poss)
    angles = Items.of(np.array([0, 1, 2]), poss).rope(shard)
    cos2, sin2 = angles.cos2, angles.sin2
    assert np.array_equal(cos2[..., 0::2], cos) and np.array_equal(cos2[..., 1::2], cos)
    assert np.array_equal(sin2[..., 0::2], -sin) and np.array_equal(sin2[..., 1::2], sin)


@fast
@given(st.lists(st.integers(0, 2), min_size=1, max_size=10))
def test_replayed_bookings_are_the_bookings_made_again(keys):
    region = Region(0, 0, 6, 5)
    direct, replayed = Ledger(WSE2), Ledger(WSE2)
    memo: dict = {}
    comms = {led: LineComm("x", Span.of(region), led, fast=True) for led in (direct, replayed)}

    def book(led: Ledger, key: int, flops: int) -> None:  # what a part books depends on its key alone
        led.compute(flops)
        with led.op("inner"):
            comms[led].book_allreduce("ktree", 2, key + 1)
        led.message(key + 1, 64, 3)

    for key in keys:
        with direct.op("part"):
            book(direct, key, 1000 * (key + 1))
        with replayed.op("part"), replayed.replay(memo, key):
            book(replayed, key, 1000 * (key + 1))
        assert not replayed.quiet
    a, b = direct.by_op["part"], replayed.by_op["part"]
    assert (a.hops, a.stages, a.messages, a.link_bytes, a.flops) == (b.hops, b.stages, b.messages, b.link_bytes,
                                                                     b.flops)
    assert abs(a.cycles - b.cycles) <= 1e-12 * a.cycles and direct.calls == replayed.calls
    assert len(memo) == len(set(keys))


def test_a_part_that_fails_half_way_is_not_replayed():
    ledger, memo = Ledger(WSE2), {}
    try:
        with ledger.op("part"), ledger.replay(memo, "k"):
            ledger.compute(10)
            raise KeyError("half way")
    except KeyError:
        pass
    assert memo == {} and not ledger.quiet
