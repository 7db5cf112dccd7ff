"""Every link's traffic per phase, recorded as the collectives book it (no Ray): a LineComm's tap sees each
booked message on its links -- the fast path's closed-form allreduces exactly as the hop-by-hop algorithms
send them -- and an MoE layer's attention and MoE phases add up to what its ledger books, the attention's
link for link what the closed forms lay on paper (waferrt.decode.phases.attention_load)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from waferrt.core.cost import ALLREDUCE_ALGOS, allreduce_cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY
from waferrt.core.topology import MESH, Topology
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.linkload import E, LinkLoad, PhaseLinks, W
from waferrt.decode.moe import MoELayerShard, pack_moe_layer
from waferrt.decode.moe_layout import MAPPINGS
from waferrt.decode.pack import Chunks
from waferrt.decode.phases import attention_load
from waferrt.fabric.comm import Collectives, LineComm, Span
from waferrt.fabric.line_links import allreduce_links, line_links, multicast_links, routes_links
from waferrt.model import synthetic_llama, tiny_moe_config

TORUS = Topology("torus")


def _recorded(region: Region, axis: str, coll: Collectives, buf: np.ndarray) -> tuple[LinkLoad, int]:
    """The links an allreduce of buf (line positions first) loads, and the link bytes its ledger booked."""
    links, ledger = PhaseLinks(region), Ledger(TINY)
    comm = LineComm(axis, Span.of(region), ledger, fast=coll.fast)
    comm.listen(links)
    comm.allreduce(buf.copy(), coll)
    return links.loads["attention"], ledger.total().link_bytes


@pytest.mark.parametrize("algo", ALLREDUCE_ALGOS)
@pytest.mark.parametrize("w,h", [(1, 3), (2, 3), (5, 2), (8, 4), (13, 1)])
@pytest.mark.parametrize("axis", ["x", "y"])
def test_a_fast_allreduce_records_the_links_the_hop_by_hop_one_uses(algo, w, h, axis):
    region = Region(2, 1, w, h)
    n, lines = (w, h) if axis == "x" else (h, w)
    buf = np.random.default_rng(n).standard_normal((n, lines, 7)).astype(np.float32)
    fast, fast_booked = _recorded(region, axis, Collectives(algo, 2, True), buf)
    slow, slow_booked = _recorded(region, axis, Collectives(algo, 2, False), buf)
    np.testing.assert_allclose(fast.bytes, slow.bytes)
    assert fast.total() == pytest.approx(fast_booked) and slow.total() == pytest.approx(slow_booked)
    whole, seg = allreduce_links(algo, n, 2)
    assert (whole.sum() * 28 + seg.sum() * 4 * -(-7 // n)) == allreduce_cost(TINY, algo, n, 28, 2).link_bytes
    assert whole[0, 0] == seg[0, 0] == 0 and whole[1, -1] == seg[1, -1] == 0  # no link leaves the line's ends


def _torus_comm(n: int, topology: Topology, fast: bool = False) -> tuple[LineComm, PhaseLinks, Ledger]:
    """A comm along a row of n cores that is a whole line of a wafer of `topology` (a torus's line wraps)."""
    region = Region(0, 0, n, 2)
    links, ledger = PhaseLinks(region), Ledger(TINY.replace(topology=topology))
    comm = LineComm("x", Span(region, region, wafer=region), ledger, fast=fast)
    comm.listen(links)
    return comm, links, ledger


@pytest.mark.parametrize("n", [3, 4, 7])
def test_a_tap_records_a_wrap_message_on_the_links_of_its_booked_route(n):
    """A message from the last core of a torus's whole line to the first takes the wrap link, one hop
    (``Topology.route``, booked as ``step_hops``): the tap sees it there and on no inner link."""
    comm, links, ledger = _torus_comm(n, TORUS)
    with ledger.op("send"):
        comm.transfer(np.ones((n, 2, 3), np.float32), [n - 1], -(n - 1))
    want = LinkLoad(Region(0, 0, n, 2))
    for p, q in TORUS.route(n, n - 1, 0):  # [(n-1, 0)]: east over the wrap
        want.bytes[E if q == (p + 1) % n else W, :, p] += 12  # 3 float32 a line
    np.testing.assert_array_equal(links.loads["attention"].bytes, want.bytes)
    assert ledger.total().hops == 1 and links.loads["attention"].total() == ledger.total().link_bytes
    assert links.loads["attention"].hottest() == 12  # the wrap link is a link of the region's


@pytest.mark.parametrize("algo", ALLREDUCE_ALGOS)
@pytest.mark.parametrize("n", [3, 6, 9])
@pytest.mark.parametrize("topology", [TORUS, Topology("mesh-switch", group=3)], ids=str)
def test_a_whole_lines_allreduce_records_its_topologys_routes_fast_or_hop_by_hop(algo, n, topology):
    """Over a torus's wrap or a mesh-switch's ports the fast path's taps are the hop-by-hop algorithm's; on the
    torus they add up to the booked link bytes (a switch's own links are not the line's)."""
    buf = np.random.default_rng(n).standard_normal((n, 2, 5)).astype(np.float32)
    got = []
    for fast in (True, False):
        comm, links, ledger = _torus_comm(n, topology, fast)
        comm.allreduce(buf.copy(), Collectives(algo, 2, fast))
        got.append(links.loads["attention"])
        if topology == TORUS:
            assert got[-1].total() == pytest.approx(ledger.total().link_bytes)
    np.testing.assert_allclose(got[0].bytes, got[1].bytes)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_the_mesh_patterns_in_closed_form_are_its_routes_counted(n):
    """line_links / multicast_links lay a mesh line's messages in closed form; ``Topology.route`` owns them."""
    for src, dist in ([list(range(n - 1)), 1], [list(range(1, n)), -1], [[0], n - 1], [[n - 1], 1 - n]):
        if n > 1:
            pairs = [(s, s + dist) for s in src]
            np.testing.assert_array_equal(line_links(n, src, dist), routes_links(n, pairs, MESH))
    for root in range(n):
        pairs = [(root, b) for b in range(n) if b != root]
        np.testing.assert_array_equal(multicast_links(n, root), routes_links(n, pairs, MESH, once=True))


def test_a_tap_needs_the_whole_region_in_its_tile():
    comm = LineComm("x", Span(Region(0, 0, 8, 2), Region(0, 0, 4, 2)), Ledger(TINY))
    with pytest.raises(ValueError, match="wholly in one tile"):
        comm.listen(PhaseLinks(Region(0, 0, 8, 2)))


@pytest.mark.parametrize("w,h,batch", [(8, 4, 1), (5, 3, 2), (4, 8, 1), (1, 1, 1)])
@pytest.mark.parametrize("shared", [0, 16])
@pytest.mark.parametrize("mapping", MAPPINGS)
def test_an_moe_layer_records_its_phases_links_as_its_ledger_books_them(w, h, batch, shared, mapping):
    config = tiny_moe_config(n_experts=4, top_k=2, shared_hidden_dim=shared)
    lw = synthetic_llama(config, seed=2).layers[0]
    region, ledger = Region(0, 0, w, h), Ledger(TINY)
    shard = MoELayerShard(Decoding(config), region, pack_moe_layer(config, lw, region, mapping),
                          KVCapacity(batch, 24), ledger)
    chunks = Chunks(config.dim, w)
    for pos in range(w + 3):
        ledger.clear()
        mark = shard.links.mark()
        x = chunks.split(np.random.default_rng(pos).standard_normal((batch, config.dim)).astype(np.float32))
        shard.forward(x, np.arange(batch), np.full(batch, pos))
        run = shard.links.since(mark)
        assert run["attention"].total() + run["moe"].total() == pytest.approx(ledger.by_op["layer"].link_bytes, abs=2)
        if batch == 1:  # one request: the closed forms' token, its K/V shift over the columns that move
            paper = attention_load(TINY, config, region, pos + 1, moving=pos % w)
            np.testing.assert_allclose(run["attention"].bytes, paper.bytes)
    assert shard.links.phase == "attention"


def test_the_moe_phase_leaves_links_cold_that_the_attention_uses():
    """What NI-Balancer's steps read: on an ER-Mapped region the attention uses every link, the MoE phase
    (router, experts in their bands, combine) leaves some cold."""
    config = tiny_moe_config(n_experts=4, top_k=1)
    region = Region(0, 0, 8, 4)
    lw = dataclasses.replace(synthetic_llama(config, seed=2).layers[0], router=np.zeros((4, config.dim), np.float32))
    shard = MoELayerShard(Decoding(config), region, pack_moe_layer(config, lw, region, "er"),
                          KVCapacity(1, 24), Ledger(TINY))
    shard.forward(Chunks(config.dim, 8).split(np.ones((1, config.dim), np.float32)), np.array([0]), np.array([3]))
    assert shard.links.loads["attention"].cold_share() == 0 < shard.links.loads["moe"].cold_share()


def test_a_migration_step_costs_what_the_runs_recorded_phases_leave_it():
    """NI-Balancer's part of a swap, booked inside a micro-batch, waits only behind the links both of the
    run's phases (as recorded) use: the layer's cycles with a migration under way minus without are its
    step_cost."""
    from waferrt.decode.balancer import Swap, step_cost

    config = tiny_moe_config(n_experts=4, top_k=1)
    region, lw = Region(0, 0, 8, 4), synthetic_llama(config, seed=2).layers[0]
    shards = [MoELayerShard(Decoding(config), region, pack_moe_layer(config, lw, region, "er"),
                            KVCapacity(1, 24), Ledger(TINY))
              for _ in range(2)]
    shards[0].migrate(Swap(0, 3), 4)
    load, chunks = shards[0].swap_traffic(Swap(0, 3)), Chunks(config.dim, 8)
    for pos in range(3):
        x = chunks.split(np.random.default_rng(pos).standard_normal((1, config.dim)).astype(np.float32))
        cycles, mark = [], shards[0].links.mark()
        for shard in shards:
            shard.ledger.clear()
            shard.forward(x, np.array([0]), np.array([pos]))
            cycles.append(shard.ledger.by_op["layer"].cycles)
        phases = shards[0].links.since(mark).values()
        want = step_cost(TINY, load, 4, list(phases)).cycles
        assert cycles[0] - cycles[1] == pytest.approx(want, abs=1e-6) and want > 0  # its links are busy in both


def test_the_alltoalls_tokens_add_up_one_by_one():
    """A batch's dispatch and combine are its tokens' one by one (AllToAll.loads routes each distinct set
    of blocks once and counts its tokens): two tokens to one set are twice one, and a mixed batch is its parts."""
    from waferrt.decode.linkload import AllToAll
    from waferrt.decode.moe_layout import expert_blocks

    region = Region(0, 0, 6, 4)
    routes = AllToAll(12, region, expert_blocks(4, region, "naive"))
    a, b = np.array([[0, 1]]), np.array([[3, 2]])
    one, two = routes.loads(a), routes.loads(np.concatenate([a, a]))
    mixed, alone = routes.loads(np.concatenate([a, b, a])), routes.loads(b)
    for i in range(2):
        assert one[i].messages > 0 and np.array_equal(two[i].bytes, 2 * one[i].bytes)
        assert np.array_equal(mixed[i].bytes, 2 * one[i].bytes + alone[i].bytes)
        assert mixed[i].messages == 2 * one[i].messages + alone[i].messages


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_the_alltoalls_phases_are_its_loads_without_the_arrays(mapping):
    """AllToAll.phases (what the expected routing prices on large regions) is, field by field, the Phase of
    AllToAll.loads' link-by-link arrays: the longest route, the messages, the bytes over all links, the busiest
    link -- for blocks of uneven rows and a batch whose tokens go to several sets of blocks more than once."""
    from waferrt.decode.linkload import AllToAll
    from waferrt.decode.moe_layout import expert_blocks

    region = Region(2, 3, 7, 10)
    routes = AllToAll(20, region, expert_blocks(6, region, mapping))
    chosen = np.argsort(np.random.default_rng(3).random((40, 6)), axis=1)[:, :2]
    phases, loads = routes.phases(chosen), routes.loads(chosen)
    assert loads[1].messages > 0  # the combine (er's dispatch needs no hop: the token is in the band's rows)
    for phase, load in zip(phases, loads):
        assert (phase.hops, phase.messages, phase.link_bytes) == (load.hops, load.messages, load.link_bytes)
        assert phase.busiest == pytest.approx(load.busiest, rel=1e-12)
