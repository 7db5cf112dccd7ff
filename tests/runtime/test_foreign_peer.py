"""A foreign process attacks a tile's receive socket while the wafer decodes, and changes nothing.

The tiny model decodes on a 3x1 mesh of tile actors; tile(1,0) has links to both others. A separate process
(multiprocessing, spawn: its own zmq context, no session key) connects to that tile's ipc endpoint over and
over while the decode runs, and sends what was seen to kill a decode before the fabric was authenticated:
a port scanner's ``GET / HTTP/1.0``, random bytes, forged fabric messages in the right format (header
"from" a real link, plausible sequence numbers, tags and epochs; over plain zmq, and over CURVE with its own
key and the tile's public key) and a 200 MB flood (a plain socket and a zmq peer). The decode's tokens
must equal the numpy reference's, the attacked tile's RSS must stay within 100 MB of what it was, every
attempt must be refused at the handshake (counted), and nothing may reach the tile's queues (no drops).
The same attacks over tcp, across two Ray nodes, are in tests/cluster/test_cluster.py.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
import time

import psutil

from waferrt.actors.tile import Tile
from waferrt.core.mesh import MeshSpec, TileId
from waferrt.core.spec import TINY
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
TARGET = TileId(1, 0)
FLOOD_BYTES, CHUNK = 200 << 20, 1 << 20
RSS_GROWTH_MAX = 100 << 20


def _unix(path: str, data: bytes, chunk: int = CHUNK) -> int:
    """Write `data` to a unix socket until the other side hangs up; the bytes it took."""
    sent, view = 0, memoryview(data)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(path)
            while sent < len(data):
                sent += s.send(view[sent:sent + chunk])
    except OSError:  # refused: the tile closed the connection
        pass
    return sent


def _forged(epoch: int) -> list:
    import msgpack
    import numpy as np

    from waferrt.faults.wire import checksum

    forged = np.full(64, 1e30, np.float32)
    head = {"from": "W", "seq": epoch, "tag": f"t{epoch}", "epoch": epoch, "sum": checksum([forged]),
            "arrays": [("<f4", (64,))]}
    return [msgpack.packb(head), forged]


def attack(ipc_path: str, server_key: bytes, stop, rounds, flooded) -> None:
    """The foreign peer: rounds of every attack until `stop` is set."""
    import numpy as np
    import zmq

    ctx = zmq.Context()
    flood = np.ones(CHUNK, np.uint8)
    while not stop.is_set():
        _unix(ipc_path, b"GET / HTTP/1.0\r\n\r\n")
        _unix(ipc_path, os.urandom(4096))
        flooded.value += _unix(ipc_path, bytes(FLOOD_BYTES) if rounds.value == 0 else os.urandom(CHUNK))
        for curve in (None, (*zmq.curve_keypair(), server_key)):
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            if curve:
                push.curve_publickey, push.curve_secretkey, push.curve_serverkey = curve
            push.connect(f"ipc://{ipc_path}")
            try:  # queued here (it never gets past the handshake) until zmq has no peer to queue for
                for epoch in range(1, 4):
                    push.send_multipart(_forged(epoch), zmq.NOBLOCK)
                for _ in range(FLOOD_BYTES // CHUNK):
                    push.send(flood, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass
            time.sleep(0.2)
            push.close(0)
        rounds.value += 1
    ctx.destroy(0)


class RssWatch:
    """The largest RSS of a process, sampled on a thread until stopped."""

    def __init__(self, pid: int):
        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def test_a_foreign_peer_during_a_decode_is_refused_and_changes_nothing(ray_session):
    placement = plan(CFG, TINY, MeshSpec(24, 8, 8, 8), kv=KVReserve(48, 3))
    requests = [GenRequest((5, 6, 7), 24), GenRequest((100, 3), 20), GenRequest((9,), 30),
                GenRequest((1, 2, 3, 4), 16)]
    sampler = Sampler(temperature=0.8, top_p=0.9, seed=5)
    want, _ = generate_reference(CFG, W, requests, sampler)
    spawn = mp.get_context("spawn")
    stop, rounds, flooded = spawn.Event(), spawn.Value("i", 0), spawn.Value("q", 0)
    with WaferLLM(CFG, W, placement) as llm:
        (before,) = llm.wafer.call([(TARGET, Tile.fabric_stats, ())])
        (pid,) = llm.wafer.call([(TARGET, Tile.pid, ())])
        rss0 = psutil.Process(pid).memory_info().rss
        watch = RssWatch(pid)
        ipc_path = before["endpoints"]["ipc"][len("ipc://"):]
        assert os.stat(os.path.dirname(ipc_path)).st_mode & 0o777 == 0o700  # other users cannot even connect
        attacker = spawn.Process(target=attack, args=(ipc_path, before["public_key"].encode(), stop, rounds,
                                                      flooded))
        attacker.start()
        try:
            deadline = time.monotonic() + 120
            while rounds.value < 1 and attacker.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)  # the first round (with the big flood) is in
            rounds_at_start, runs = rounds.value, []
            while not runs or (rounds.value == rounds_at_start and len(runs) < 8):  # until a round overlaps
                runs.append([c.tokens for c in llm.generate(requests, sampler)[0]])
            rounds_during = rounds.value - rounds_at_start
            peak = watch.stop()
        finally:
            stop.set()
            attacker.join(30)
            if attacker.exitcode is None:
                attacker.kill()
        (after,) = llm.wafer.call([(TARGET, Tile.fabric_stats, ())])
    assert attacker.exitcode == 0, "the attacking process failed"
    assert rounds.value >= 2 and rounds_during >= 1, f"the attack did not overlap the decode ({rounds.value} rounds)"
    assert runs == [[c.tokens for c in want]] * len(runs)
    assert peak - rss0 < RSS_GROWTH_MAX, f"the attacked tile grew from {rss0 >> 20} MB to {peak >> 20} MB"
    refused = after["refused"] - before["refused"]
    assert refused >= 4 * rounds.value, after  # per round: HTTP, garbage, flood, a plain zmq peer (and more)
    assert after["zap_denied"] - before["zap_denied"] >= rounds.value, after  # the peer with its own key
    assert after["dropped"] == {}, f"a stranger's bytes reached the tile's queue: {after['dropped']}"
    assert flooded.value < FLOOD_BYTES, "the tile read the whole flood"
