"""Properties of the pure geometry: Coord/Dir/Region/MeshSpec, DSM layouts and their blocks, the SRAM book.

Hypothesis draws small meshes, regions, tensor shapes and splits; each property is checked against a
brute-force reading of the definition (every core, every index), so a wrong formula cannot hide.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waferrt.core.layout import Layout, chunk_bounds, core_bytes, from_blocks, to_blocks
from waferrt.core.mesh import Coord, Dir, Extent, MeshSpec, Region, TileId, wafer_grid
from waferrt.core.spec import TINY, WSE2
from waferrt.core.sram import SramBook, SramOverflow

# per test, not a global profile (other modules' hypothesis tests keep theirs); no example database files
fast = settings(max_examples=60, deadline=None, database=None)

coords = st.builds(Coord, st.integers(0, 20), st.integers(0, 20))
regions = st.builds(Region, st.integers(0, 6), st.integers(0, 6), st.integers(1, 6), st.integers(1, 6))


@st.composite
def meshes(draw):
    w, h = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    return MeshSpec(w, h, draw(st.integers(1, w)), draw(st.integers(1, h)))


# -- Dir, Coord ---------------------------------------------------------------------------------------------
def test_directions_are_one_hop_and_opposites():
    for d in Dir:
        assert d.opposite.opposite == d and d.opposite != d
        assert Dir.of_step(*d.value) == d and abs(d.value[0]) + abs(d.value[1]) == 1
    with pytest.raises(ValueError, match="not one hop"):
        Dir.of_step(1, 1)


@fast
@given(coords, coords, coords)
def test_hops_are_manhattan_distance(a, b, c):
    assert a.hops_to(b) == b.hops_to(a) == abs(a.x - b.x) + abs(a.y - b.y)
    assert a.hops_to(c) <= a.hops_to(b) + b.hops_to(c)
    for d in Dir:
        assert a.step(d).hops_to(a) == 1 and a.step(d).step(d.opposite) == a


# -- Region -------------------------------------------------------------------------------------------------
def test_region_rejects_empty_and_negative():
    with pytest.raises(ValueError, match="at least 1x1"):
        Region(0, 0, 0, 3)
    with pytest.raises(ValueError, match="x, y >= 0"):
        Region(-1, 0, 2, 2)


@fast
@given(regions, regions)
def test_region_set_operations_match_their_cores(a, b):
    ca, cb = set(a.cores()), set(b.cores())
    assert len(ca) == a.size == a.w * a.h and a.shape == (a.h, a.w)
    assert all(a.contains(c) for c in ca)
    inter = a.intersect(b)
    assert (set(inter.cores()) if inter else set()) == ca & cb
    assert a.intersect(b) == b.intersect(a)
    assert a.covers(b) == (cb <= ca)
    one_hop = any(p.hops_to(q) == 1 for p in ca for q in cb)
    assert a.touches(b) == b.touches(a) == (one_hop and not ca & cb)
    for c in ca:
        r, col = a.local(c)
        assert (a.x0 + col, a.y0 + r) == (c.x, c.y)


# -- MeshSpec and tiles -------------------------------------------------------------------------------------
@fast
@given(meshes())
def test_tiles_cover_the_mesh_exactly_once(mesh):
    owner = {}
    for t in mesh.tiles():
        reg = mesh.tile_region(t)
        assert mesh.region.covers(reg) and reg.w <= mesh.tile_w and reg.h <= mesh.tile_h
        for c in reg.cores():
            assert c not in owner, f"core {c} in two tiles"
            owner[c] = t
    assert set(owner) == set(mesh.region.cores())
    assert all(mesh.tile_of(c) == t for c, t in owner.items())
    assert len(mesh.tiles()) == mesh.tiles_x * mesh.tiles_y


@fast
@given(meshes(), regions)
def test_tile_neighbours_and_tiles_of_a_region(mesh, r):
    for t, d in itertools.product(mesh.tiles(), Dir):
        n = mesh.tile_neighbour(t, d)
        if n is not None:
            assert mesh.tile_region(t).touches(mesh.tile_region(n))
            assert mesh.tile_neighbour(n, d.opposite) == t
        else:
            edge = {Dir.W: t.tx == 0, Dir.N: t.ty == 0, Dir.E: t.tx == mesh.tiles_x - 1,
                    Dir.S: t.ty == mesh.tiles_y - 1}
            assert edge[d]
    want = {mesh.tile_of(c) for c in r.cores() if mesh.region.contains(c)}
    assert set(mesh.tiles_of(r)) == want


def test_mesh_errors_say_what_fits():
    with pytest.raises(ValueError, match="tile 5x1 is larger than the mesh 4x4"):
        MeshSpec(4, 4, 5, 1)
    with pytest.raises(ValueError, match=r"tile\(2,0\) is outside the 2x2 grid"):
        MeshSpec(4, 4, 2, 2).tile_region(TileId(2, 0))
    with pytest.raises(ValueError, match=r"dead core \(x=9, y=9\) is outside"):
        MeshSpec(4, 4, 2, 2, frozenset({Coord(9, 9)}))


# -- chunking and layouts -----------------------------------------------------------------------------------
@fast
@given(st.integers(1, 8), st.integers(1, 40), st.sampled_from([1, 2, 4]))
def test_chunks_are_contiguous_even_whole_granules_largest_first(parts, units, granule):
    n = units * granule
    if parts > units:
        with pytest.raises(ValueError, match=f"at most {units} cores"):
            chunk_bounds(n, parts, granule)
        return
    b = chunk_bounds(n, parts, granule)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == n and len(sizes) == parts
    assert (sizes % granule == 0).all() and sizes.max() - sizes.min() <= granule
    assert (np.diff(sizes) <= 0).all()


@st.composite
def layouts(draw):
    region = draw(st.builds(Region, st.integers(0, 3), st.integers(0, 3), st.integers(1, 4),
                            st.integers(1, 4)))
    ndim = draw(st.integers(1, 3))
    split = draw(st.permutations(["x", "y"] + [None] * ndim).map(lambda p: tuple(p[:ndim])))
    shape, granule = [], []
    for s in split:
        g = draw(st.sampled_from([1, 2]))
        parts = {"x": region.w, "y": region.h, None: 1}[s]
        shape.append(g * draw(st.integers(parts, parts + 5)))
        granule.append(g)
    return Layout(tuple(shape), region, split, tuple(granule))


@fast
@given(layouts(), st.randoms(use_true_random=False))
def test_blocks_round_trip_and_hold_what_the_layout_says(layout, rnd):
    a = np.arange(int(np.prod(layout.shape)), dtype=np.float32).reshape(layout.shape) + 1
    blocks = to_blocks(a, layout)
    assert blocks.shape == layout.region.shape + layout.max_block_shape()
    np.testing.assert_array_equal(from_blocks(blocks, layout), a)
    nbytes = core_bytes(layout)
    for r, c in itertools.product(range(layout.region.h), range(layout.region.w)):
        sl = layout.block_slices(r, c)
        real = tuple(slice(0, s.stop - s.start) for s in sl)
        np.testing.assert_array_equal(blocks[(r, c) + real], a[sl])
        assert blocks[r, c].sum() == a[sl].sum()  # the padding is zeros
        assert nbytes[r, c] == a[sl].size * 4
    assert layout.max_block_bytes() == nbytes.max() == nbytes[0, 0]  # chunks are largest first
    index = tuple(rnd.randrange(n) for n in layout.shape)
    for core in layout.owners(index):
        r, c = layout.region.local(core)
        assert all(s.start <= i < s.stop for i, s in zip(index, layout.block_slices(r, c), strict=True))
    expected = 1
    for s in ("x", "y"):
        if s not in layout.split:
            expected *= layout.region.w if s == "x" else layout.region.h
    assert len(layout.owners(index)) == expected


def test_layout_errors_name_the_problem():
    r = Region(0, 0, 4, 2)
    with pytest.raises(ValueError, match="at most one tensor axis may be split over mesh axis 'x'"):
        Layout((8, 8), r, ("x", "x"))
    with pytest.raises(ValueError, match="use at most 3 cores"):
        Layout((3,), r, ("x",))
    with pytest.raises(ValueError, match="whole granules of 2"):
        Layout((7,), r, ("x",), (2,))
    with pytest.raises(ValueError, match=r"does not match the layout's shape \(8,\)"):
        to_blocks(np.zeros(9), Layout((8,), r, ("x",)))


# -- SRAM book ----------------------------------------------------------------------------------------------
@fast
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 4), st.integers(1, 4),
                          st.integers(1, 3000), st.booleans()), max_size=12))
def test_sram_book_is_the_sum_of_live_tensors_and_overflow_books_nothing(ops):
    tile = Region(2, 1, 4, 4)
    book, live = SramBook(tile, 8000), {}
    for i, (x, y, w, h, nbytes, release) in enumerate(ops):
        region = Region(tile.x0 + x, tile.y0 + y, min(w, 4 - x), min(h, 4 - y))
        if release and live:
            book.release(live.popitem()[0])
        before = book.used.copy()
        try:
            book.reserve(f"t{i}", region, nbytes)
            live[f"t{i}"] = (region, nbytes)
        except SramOverflow as e:
            np.testing.assert_array_equal(book.used, before)
            assert e.tensor == f"t{i}" and region.contains(e.core) and e.asked == nbytes
            assert e.free == book.free_bytes()[tile.local(e.core)] < nbytes
            assert f"{e.free} of 8000 bytes free" in str(e)
        want = np.zeros(tile.shape, np.int64)
        for reg, nb in live.values():
            r0, c0 = tile.local(Coord(reg.x0, reg.y0))
            want[r0:r0 + reg.h, c0:c0 + reg.w] += nb
        np.testing.assert_array_equal(book.used, want)
        assert (book.used <= 8000).all() and book.stats()["tensors"] == len(live)


def test_a_coord_is_the_tuple_x_y():
    c = Coord(3, 4)
    x, y = c
    assert (x, y) == (3, 4) and c == (3, 4) and hash(c) == hash((3, 4)) and {(3, 4): "a"}[c] == "a"
    assert Coord(np.int64(3), 4) == c and type(Coord(np.int64(3), 4).x) is int
    assert sorted([Coord(1, 0), Coord(0, 5)]) == [(0, 5), (1, 0)]
    with pytest.raises(TypeError, match="Coord.x must be a whole number"):
        Coord(1.5, 2)


def test_an_extent_is_named_counts_its_cores_and_refuses_a_fraction():
    e = Extent(4, 2)
    assert (e.width, e.height, e.cores, str(e)) == (4, 2, 8, "4x2")
    assert e == (4, 2) and hash(e) == hash((4, 2))  # a tuple read from a flag or a saved plan compares equal
    with pytest.raises(TypeError, match=r"Extent.width must be a whole number .* got 1.5"):
        Extent(1.5, 2)


def test_a_meshs_tile_is_an_extent_and_the_wafer_holds_whole_tiles_of_it():
    assert MeshSpec(10, 6, 4, 3).tile == Extent(4, 3)  # the last column of tiles is 2 wide: the tile is still 4x3
    # tiles across and down, the last one overhanging: 64/5 -> 13, 64/7 -> 10; 750/100 -> 8, 994/497 -> 2
    assert wafer_grid(TINY, Extent(5, 7)) == Extent(13, 10) and wafer_grid(WSE2, Extent(100, 497)) == Extent(8, 2)
