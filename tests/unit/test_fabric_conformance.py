"""One conformance suite for both fabrics that implement waferrt.fabric.links.Links: the in-process one
(threads and queues) and the real one between tile actors (pyzmq over ipc, here without Ray: the sockets
of three tiles in one process). Then what only the real fabric can get wrong: lost, duplicated and stale
messages on a socket.

A 3x1 mesh of one-core tiles: A=tile(0,0), B=tile(1,0), C=tile(2,0); A and C are B's W and E neighbours.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from fabrics import close_all, zmq_tiles

from waferrt.core.mesh import Dir, MeshSpec, TileId
from waferrt.fabric.links import FabricError, FabricProtocolError, FabricTimeout
from waferrt.fabric.loop import LoopFabric

MESH = MeshSpec(3, 1, 1, 1)
A, B, C = (TileId(i, 0) for i in range(3))
TIMEOUT = 0.5


@pytest.fixture(params=["loop", "zmq"])
def links(request, tmp_path):
    if request.param == "loop":
        fabric = LoopFabric(MESH, timeout=TIMEOUT)
        yield {t: fabric.links(t) for t in (A, B, C)}
        return
    out = zmq_tiles(str(tmp_path), MESH, TIMEOUT)
    yield out
    close_all(out)


ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([-1, 2**40], np.int64),
          np.array(7.5, np.float64), np.zeros((0, 3), np.float32), np.array([1, 65535], np.uint16),
          np.arange(70000, dtype=np.float32)]  # the last one is large enough to go without a copy


def test_arrays_arrive_whole_with_dtype_and_shape(links):
    links[A].send(Dir.E, "m1", ARRAYS)
    got = links[B].recv(Dir.W, "m1")
    assert len(got) == len(ARRAYS)
    for a, b in zip(ARRAYS, got, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(a, b)


def test_a_link_keeps_its_order_and_links_do_not_mix(links):
    for i in range(5):
        links[A].send(Dir.E, f"a{i}", [np.full(2, i)])
        links[C].send(Dir.W, f"c{i}", [np.full(2, 10 + i)])
    got_c = [int(links[B].recv(Dir.E, f"c{i}")[0][0]) for i in range(5)]  # C's first, though A's came first
    got_a = [int(links[B].recv(Dir.W, f"a{i}")[0][0]) for i in range(5)]
    assert got_c == [10, 11, 12, 13, 14] and got_a == [0, 1, 2, 3, 4]


def test_both_directions_of_a_link(links):
    links[B].send(Dir.W, "back", [np.array([3])])
    links[A].send(Dir.E, "forth", [np.array([4])])
    assert links[A].recv(Dir.E, "back")[0][0] == 3 and links[B].recv(Dir.W, "forth")[0][0] == 4


def test_messages_are_numbered_per_link_and_the_receiver_sees_the_senders_number(links):
    assert links[A].sent[Dir.E] == 0 and links[B].taken[Dir.W] == 0
    for i in range(3):
        links[A].send(Dir.E, f"a{i}", [np.zeros(1)])
    links[C].send(Dir.W, "c0", [np.zeros(1)])
    links[B].send(Dir.W, "back", [np.zeros(1)])
    assert (links[A].sent[Dir.E], links[C].sent[Dir.W], links[B].sent[Dir.W]) == (3, 1, 1)  # each link its own
    taken = []
    for i in range(3):
        links[B].recv(Dir.W, f"a{i}")
        taken.append(links[B].taken[Dir.W])
    d, _, _ = links[B].recv_any(TIMEOUT)
    assert taken == [1, 2, 3] and (d, links[B].taken[Dir.E]) == (Dir.E, 1)
    links[A].recv(Dir.E, "back")
    assert links[A].taken[Dir.E] == 1


def test_a_mismatched_tag_names_both_tags(links):
    links[A].send(Dir.E, "step1", [np.zeros(1)])
    with pytest.raises(FabricProtocolError, match="'step2'.*'step1'|'step1'.*'step2'"):
        links[B].recv(Dir.W, "step2")


def test_silence_ends_in_a_timeout_that_names_the_tile_and_link(links):
    t0 = time.monotonic()
    with pytest.raises(FabricTimeout, match=r"tile\(1,0\).*\bE\b") as err:
        links[B].recv(Dir.E, "never")
    assert isinstance(err.value, FabricError) and time.monotonic() - t0 < TIMEOUT + 2


def test_no_link_beyond_the_mesh_edge(links):
    with pytest.raises(FabricProtocolError, match=r"tile\(0,0\).*W"):
        links[A].send(Dir.W, "off the edge", [np.zeros(1)])


# -- what only a socket can do wrong --------------------------------------------------------------------
@pytest.fixture
def zmq(tmp_path):
    out = zmq_tiles(str(tmp_path), MESH, TIMEOUT)
    yield out
    close_all(out)


def test_a_lost_message_is_detected(zmq):
    zmq[A].send(Dir.E, "m1", [np.zeros(1)])
    zmq[A].sent[Dir.E] += 1  # message 2 "never left": the next one carries sequence number 3
    zmq[A].send(Dir.E, "m3", [np.zeros(1)])
    assert zmq[B].recv(Dir.W, "m1")
    with pytest.raises(FabricProtocolError, match="message 3 on the W link arrived when 2 was due: .*lost"):
        zmq[B].recv(Dir.W, "m3")


def test_a_duplicated_message_is_detected(zmq):
    zmq[A].send(Dir.E, "m1", [np.zeros(1)])
    zmq[A].sent[Dir.E] -= 1  # the same sequence number goes out twice
    zmq[A].send(Dir.E, "m1", [np.zeros(1)])
    assert zmq[B].recv(Dir.W, "m1")
    with pytest.raises(FabricProtocolError, match="message 1 on the W link arrived when 2 was due: .*duplicated"):
        zmq[B].recv(Dir.W, "m1")


def test_messages_of_an_earlier_command_are_dropped(zmq):
    zmq[A].send(Dir.E, "old", [np.zeros(1)])  # left over from command 0, which failed
    zmq[A].epoch = zmq[B].epoch = 1
    zmq[A].send(Dir.E, "new", [np.ones(1)])
    assert zmq[B].recv(Dir.W, "new")[0][0] == 1


def test_recv_any_takes_what_arrives_from_any_link_and_waits_without_error(links):
    assert links[B].recv_any(0.05) is None  # nothing yet: no error, just nothing
    links[A].send(Dir.E, "first", [np.array([1])])
    d, tag, arrays = links[B].recv_any(TIMEOUT)
    assert (d, tag, int(arrays[0][0])) == (Dir.W, "first", 1)
    for i in range(3):
        links[C].send(Dir.W, f"c{i}", [np.array([10 + i])])
        links[A].send(Dir.E, f"a{i}", [np.array([i])])
    got = [links[B].recv_any(TIMEOUT) for _ in range(6)]
    for d, prefix in ((Dir.E, "c"), (Dir.W, "a")):  # every link in its own order
        assert [tag for dd, tag, _ in got if dd == d] == [f"{prefix}{i}" for i in range(3)]
    links[C].send(Dir.W, "mixed", [np.array([4])])  # recv and recv_any share the same queues
    links[A].send(Dir.E, "mixed", [np.array([5])])
    assert links[B].recv(Dir.W, "mixed")[0][0] == 5 and links[B].recv_any(TIMEOUT)[2][0][0] == 4
