"""The fabric's door, without Ray: three tiles' ZmqLinks in one process (a 3x1 mesh: A, B, C), B under test.

1. Peers without a neighbour's key pair never get a byte into B's queue: a plain socket writing garbage or
   an HTTP request, a zmq peer with no CURVE, one with its own keys, one that claims A's public key without
   its secret are all refused and counted, and B's real neighbours still get through.
2. An authenticated sender (a raw PUSH socket with A's key pair, i.e. a buggy or compromised neighbour)
   sends each kind of malformed message; every one is dropped and counted under its reason, never raised,
   and the good message that follows on the same connection arrives.
3. The bounds: a frame over the size cap never reaches the queue (the sender is disconnected); a link's
   pending queue stops at its cap, and the message lost to it is reported by that link's recv.
4. A neighbour replaced by a restarted tile (``rewire``): what its old process still sends -- queued before,
   or sent after over the connection it kept (a tile on a lost node can outlive it a moment) -- is dropped
   as ``replaced_peer``; the new tile's messages arrive, numbered from 1.
"""

from __future__ import annotations

import socket
import time

import msgpack
import numpy as np
import pytest
import zmq
from fabrics import close_all, zmq_tiles

from waferrt.actors.fabric import FabricLimits
from waferrt.core.mesh import Dir, MeshSpec, TileId
from waferrt.fabric.links import FabricProtocolError, FabricTimeout
from waferrt.faults.wire import checksum

MESH = MeshSpec(3, 1, 1, 1)
A, B, C = (TileId(i, 0) for i in range(3))
TIMEOUT = 2.0


@pytest.fixture
def fabric(tmp_path):
    links = zmq_tiles(str(tmp_path), MESH, TIMEOUT)
    yield links
    close_all(links)


def wait_for(stats, done, seconds: float = 10.0) -> dict:
    """The gatekeeper counts on its own thread: the stats once `done(stats)` holds (or the deadline passed)."""
    deadline = time.monotonic() + seconds
    while not done(s := stats()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return s


def header(**over) -> bytes:
    head = {"from": "W", "seq": 1, "tag": "good", "epoch": 0, "sum": checksum([np.arange(3, dtype=np.float32)]),
            "arrays": [("<f4", (3,))], **over}
    return msgpack.packb(head)


GOOD = [header(), np.arange(3, dtype=np.float32).tobytes()]


# -- 1. refused at the door ------------------------------------------------------------------------------
def test_peers_without_a_neighbours_keys_are_refused_and_counted(fabric):
    links = fabric
    address = links[B].endpoints["ipc"]
    ipc_path = address[len("ipc://"):]
    for data in (b"GET / HTTP/1.0\r\n\r\n", bytes(range(256)) * 64):  # a port scanner, garbage
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(ipc_path)
            try:
                s.sendall(data)
            except OSError:  # refused while still writing
                pass
    ctx = zmq.Context()
    stranger_public, stranger_secret = zmq.curve_keypair()
    peers = {"no CURVE": None, "its own keys": (stranger_public, stranger_secret, links[B].public),
             "A's public key, not its secret": (links[A].public, stranger_secret, links[B].public)}
    socks = []
    for curve in peers.values():
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        if curve:
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = curve
        s.connect(address)
        s.send_multipart([header(), np.zeros(3, np.float32).tobytes()], zmq.NOBLOCK)  # forged, well-formed
        socks.append(s)
    stats = wait_for(links[B].stats, lambda s: s["authenticated"] == 2 and s["refused"] >= 5 and s["zap_denied"])
    assert stats["authenticated"] == 2 and stats["refused"] >= 5, stats  # A and C; HTTP, garbage, 3 zmq peers
    assert stats["zap_denied"] == stats["handshake_failed_auth"] == 1, stats  # its own keys: a valid handshake
    links[A].send(Dir.E, "real", [np.ones(2)])
    np.testing.assert_array_equal(links[B].recv(Dir.W, "real")[0], np.ones(2))  # not the forged zeros
    assert links[B].stats()["dropped"] == {}, "a stranger's message reached the queue"
    for s in socks:
        s.close(0)
    ctx.term()


# -- 2. malformed messages from an authenticated sender ---------------------------------------------------
def raw_neighbour(links, ctx):
    """A PUSH with tile A's key pair (B admits it as its W neighbour) that sends whatever frames."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.curve_publickey, s.curve_secretkey, s.curve_serverkey = links[A].public, links[A].secret, links[B].public
    s.connect(links[B].endpoints["ipc"])
    return s


MALFORMED = {
    "not_msgpack": [[b"GET / HTTP/1.0\r\n\r\n"], [b"\xc1\xc1"], [b""]],
    "bad_header": [[msgpack.packb([1, 2])], [header(seq=-1)], [header(tag=5)], [header(arrays=[("<f4", (-1,))])],
                   [msgpack.packb({"from": "W"})], [header(extra=1)]],
    "no_link": [[header(**{"from": "N"}), GOOD[1]], [header(**{"from": "X"}), GOOD[1]]],
    "wrong_link": [[header(**{"from": "E"}), GOOD[1]]],  # B has an E link, but this key is its W neighbour's
    "frame_count": [[header()], [*GOOD, b"more"]],
    "bad_array": [[header(), b"12345678"], [header(arrays=[("|O", (1,))]), b"x" * 8],
                  [header(arrays=[("V12", (1,))]), GOOD[1]], [header(arrays=[("nonsense", (3,))]), GOOD[1]]],
}


@pytest.mark.parametrize("reason,messages", MALFORMED.items(), ids=list(MALFORMED))
def test_a_malformed_message_is_dropped_and_counted_and_the_next_one_arrives(fabric, reason, messages):
    links = fabric
    ctx = zmq.Context()
    sender = raw_neighbour(links, ctx)
    for frames in messages:
        sender.send_multipart(frames)
    sender.send_multipart(GOOD)  # the same connection: it arrives after the malformed ones
    got = links[B].recv(Dir.W, "good")
    np.testing.assert_array_equal(got[0], np.arange(3, dtype=np.float32))
    assert links[B].stats()["dropped"] == {reason: len(messages)}
    sender.close(0)
    ctx.term()


# -- 3. bounds ----------------------------------------------------------------------------------------------
def test_oversized_messages_never_reach_the_queue(tmp_path):
    links = zmq_tiles(str(tmp_path), MESH, TIMEOUT, FabricLimits(message_bytes=4096))
    ctx = zmq.Context()
    try:
        sender = raw_neighbour(links, ctx)
        big = np.zeros(600, np.float32).tobytes()  # 2400 bytes: each frame under the cap, together over it
        sender.send_multipart([header(arrays=[("<f4", (600,)), ("<f4", (600,))]), big, big])
        sender.send_multipart(GOOD)
        assert links[B].recv(Dir.W, "good")[0].shape == (3,)
        assert links[B].stats()["dropped"] == {"oversized": 1}
        sender.send_multipart([header(arrays=[("<f4", (2048,))]), bytes(8192)])  # one frame over zmq's cap
        assert wait_for(links[B].stats, lambda s: s["disconnected"])["disconnected"] == 1  # zmq cut it off
        sender.send_multipart([header(seq=2, tag="after"), GOOD[1]])  # it reconnects; the link goes on
        assert links[B].recv(Dir.W, "after")[0].shape == (3,)
        assert links[B].stats()["dropped"] == {"oversized": 1}
    finally:
        ctx.destroy(0)
        close_all(links)


def test_a_full_pending_queue_drops_and_its_link_reports_the_loss(tmp_path):
    links = zmq_tiles(str(tmp_path), MESH, TIMEOUT, FabricLimits(pending=2))
    try:
        for i in range(4):
            links[A].send(Dir.E, f"w{i}", [np.full(1, i)])
        with pytest.raises(FabricTimeout, match=r"dropped messages: \{'backlog': 2\}"):
            links[B].recv(Dir.E, "e")  # B takes A's messages off the socket while it waits for C's
        assert links[B].stats()["pending"] == {"W": 2}
        assert [links[B].recv(Dir.W, f"w{i}")[0][0] for i in range(2)] == [0, 1]
        links[A].send(Dir.E, "w4", [np.full(1, 4)])
        with pytest.raises(FabricProtocolError, match="message 5 on the W link arrived when 3 was due"):
            links[B].recv(Dir.W, "w4")
        links[A].send(Dir.E, "w5", [np.full(1, 5)])
        assert links[B].recv(Dir.W, "w5")[0][0] == 5  # then the link follows the sender again
    finally:
        close_all(links)


# -- 4. a replaced neighbour ----------------------------------------------------------------------------------
def test_a_replaced_neighbours_messages_are_dropped_and_its_successors_arrive(tmp_path, fabric):
    from waferrt.actors.fabric import ZmqLinks

    links = fabric
    links[A].send(Dir.E, "hello", [np.ones(1)])
    links[B].recv(Dir.W, "hello")  # A's connection is up (else its handshake after the rewire is refused)
    links[A].send(Dir.E, "queued", [np.ones(1)])  # still in B's socket when A is replaced
    new = ZmqLinks(A, TIMEOUT)
    try:
        address = new.bind(str(tmp_path / "restarted"))
        new.admit({Dir.E: links[B].public})
        links[B].rewire(Dir.W, address["key"], address["ipc"])
        new.connect({Dir.E: links[B].endpoints["ipc"]})
        links[A].send(Dir.E, "late", [np.ones(1)])  # the old A lives on, over the connection it had
        new.send(Dir.E, "fresh", [np.full(1, 7.0)])
        assert links[B].recv(Dir.W, "fresh")[0][0] == 7.0
        deadline = time.monotonic() + 10  # the old A's two messages may come late on a busy machine
        while links[B].stats()["dropped"].get("replaced_peer", 0) < 2 and time.monotonic() < deadline:
            assert links[B].recv_any(0.1) is None  # nothing of the old A's gets through
        assert links[B].stats()["dropped"] == {"replaced_peer": 2}
        assert links[B].stats()["received"]["W"] == 1  # numbered from 1 again
    finally:
        new.close()
