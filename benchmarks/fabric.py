"""Fabric benchmark: a neighbour link between two tile actors next to raw pyzmq, and allreduce K-tree vs ring.

Contract: ``python benchmarks/fabric.py [--quick]`` prints, from one run on this machine:

1. the neighbour link between two Ray tile actors (their real ``ZmqLinks``, through
   ``benchmarks/probe.py``'s ``ProbeTile``): 4 KB round-trip latency and 1 MB-buffer streaming throughput;
2. the same two measurements with raw pyzmq (PUSH/PULL over ipc, zero-copy, no header) between two plain
   processes (multiprocessing, spawn), once in the clear and once with CURVE, as the tile links are (the
   cost of encryption, apart from the fabric's own);
3. the ratios of the tile link's speed to raw pyzmq's and to raw CURVE pyzmq's (1.0: as fast; throughput
   goal against the same encryption: >= 0.7), of the best runs and of the medians;
4. an allreduce along a 1x64 row of cores (4 tile actors of 16 cores) with the K-tree and the ring:
   wall time per run (median) and modelled cycles.

Every measurement is timed inside the processes that move the data (not the Ray calls that start them);
raw and tile runs alternate, so both see the same machine. Exits non-zero if the fabric delivers wrong
data or an allreduce differs from numpy.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import tempfile
import time

import numpy as np

LAT_BYTES, THR_BYTES = 4096, 1 << 20


# -- raw pyzmq between two plain processes ------------------------------------------------------------
def _raw_run(pull, push, role: str, buf: np.ndarray, n: int) -> float:
    t0 = time.perf_counter()
    if role == "ping":
        for _ in range(n):
            push.send(buf, copy=False)
            pull.recv(copy=False)
    elif role == "pong":
        for _ in range(n):
            push.send(pull.recv(copy=False), copy=False)
    elif role == "stream":
        for _ in range(n):
            push.send(buf, copy=False)
        pull.recv()
    else:  # drain
        for _ in range(n):
            pull.recv(copy=False)
        push.send(b"ack")
    return time.perf_counter() - t0


def _raw_peer(my_addr: str, peer_addr: str, commands, out, curve: tuple | None) -> None:
    """One of two long-lived plain processes (PULL bound here, PUSH to the peer, like a tile's links):
    runs (role, nbytes, n) commands until it gets None. `curve`: (own public, own secret, peer's public)
    keys, or None for the clear."""
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for s in (pull, push):
        s.setsockopt(zmq.LINGER, 0)
    if curve:
        pull.curve_server, pull.curve_secretkey = True, curve[1]
        push.curve_publickey, push.curve_secretkey, push.curve_serverkey = curve
    pull.bind(my_addr)
    push.connect(peer_addr)
    push.send(b"hello")  # both sides are connected once each has heard the other
    pull.recv()
    while (cmd := commands.get()) is not None:
        role, nbytes, n = cmd
        out.put((role, _raw_run(pull, push, role, np.ones(nbytes, np.uint8), n)))
    pull.close()
    push.close()
    ctx.term()


class RawPair:
    """Two plain processes (multiprocessing, spawn) linked by raw pyzmq, in the clear or with CURVE, kept
    alive between runs as the tile actors are."""

    def __init__(self, curve: bool):
        import zmq

        self.dir = tempfile.mkdtemp(prefix="waferrt-bench-")
        spawn = mp.get_context("spawn")
        self.out = spawn.Queue()
        self.cmds = [spawn.Queue(), spawn.Queue()]
        a, b = f"ipc://{self.dir}/a", f"ipc://{self.dir}/b"
        ka, kb = zmq.curve_keypair(), zmq.curve_keypair()
        keys = ((*ka, kb[0]), (*kb, ka[0])) if curve else (None, None)
        self.procs = [spawn.Process(target=_raw_peer, args=(a, b, self.cmds[0], self.out, keys[0])),
                      spawn.Process(target=_raw_peer, args=(b, a, self.cmds[1], self.out, keys[1]))]
        for p in self.procs:
            p.start()

    def run(self, roles: tuple[str, str], nbytes: int, n: int) -> float:
        """Seconds the first role took."""
        for q, role in zip(self.cmds, roles, strict=True):
            q.put((role, nbytes, n))
        times: dict[str, float] = {}
        deadline = time.monotonic() + 120
        while len(times) < 2:
            try:
                role, seconds = self.out.get(timeout=1)
                times[role] = seconds
            except queue.Empty:
                dead = [p.exitcode for p in self.procs if p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    raise SystemExit(f"raw pyzmq peers failed (exit codes {dead}) or hung") from None
        return times[roles[0]]

    def close(self) -> None:
        for q in self.cmds:
            q.put(None)
        for p in self.procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the same between two tile actors -------------------------------------------------------------------
def start_probe_pair():
    import probe  # benchmarks/probe.py, next to this script
    import ray
    from ray import cloudpickle

    from waferrt.actors.remote import TileLaunch, driver_node, start_tiles
    from waferrt.actors.stream import HostInbox
    from waferrt.core.mesh import MeshSpec
    from waferrt.core.spec import TINY

    cloudpickle.register_pickle_by_value(probe)  # the tile processes cannot import a module of benchmarks/
    cls = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(probe.ProbeTile)
    ipc_dir = tempfile.mkdtemp(prefix="waferrt-")
    mesh, here = MeshSpec(2, 1, 1, 1), driver_node()
    inbox = HostInbox(ipc_dir)  # where the tiles beat (nobody listens here: the benchmark only streams)
    tiles = start_tiles(TileLaunch(mesh, TINY, "waferrt-bench", ipc_dir, dict.fromkeys(mesh.tiles(), here), 60.0,
                                   inbox.addresses, tile_cls=cls))
    a, b = tiles.values()
    return tiles, a, b, ipc_dir


def tile_latency(a, b, n: int) -> float:
    import ray

    t, _ = ray.get([a.ping.remote("E", LAT_BYTES, n), b.pong.remote("W", n)])
    return t


def tile_stream(a, b, n: int) -> float:
    import ray

    t, got = ray.get([a.stream.remote("E", THR_BYTES, n), b.drain.remote("W", n)])
    if got != n * THR_BYTES:
        raise SystemExit(f"the fabric delivered {got} bytes, {n * THR_BYTES} were sent")
    return t


# -- allreduce K-tree vs ring on a row of 64 cores -------------------------------------------------------
def allreduce_row(repeats: int) -> dict[str, tuple[float, float]]:
    from waferrt.runtime import Wafer

    out = {}
    x = np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)
    with Wafer(spec="wse2", mesh=(64, 1), tile=(16, 1)) as wafer:
        wafer.dsm.alloc("x", x.shape, split=("y", "x", None))
        wafer.dsm.alloc("y", x.shape, split=("y", "x", None))
        wafer.dsm.put("x", x)
        for algo in ("ktree", "ring"):
            def kernel(ctx, algo):
                ctx.store("y", ctx.allreduce(ctx.load("x"), "x", algo))

            walls = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                cost = wafer.run(kernel, algo=algo)
                walls.append(time.perf_counter() - t0)
            y = wafer.dsm.get("y")
            if not np.allclose(y, np.broadcast_to(x.sum(1, keepdims=True), x.shape), rtol=1e-4, atol=1e-3):
                raise SystemExit(f"allreduce.{algo} over the row differs from numpy")
            out[algo] = (statistics.median(walls), cost[f"allreduce.{algo}"].cycles)
    return out


def measure_links(raws: dict[str, RawPair], a, b, n_lat: int, n_thr: int, reps: int) -> dict[str, list[float]]:
    """Interleaved repetitions (raw, CURVE, tile, raw, CURVE, tile, ...) so all see the same machine: this
    VM's two cores make single runs vary up to 3x. Latency in seconds per round trip, throughput in bytes/s."""
    out: dict[str, list[float]] = {f"{name}_{key}": [] for name in (*raws, "tile") for key in ("lat", "thr")}
    for raw in raws.values():  # warm every pair up
        raw.run(("ping", "pong"), LAT_BYTES, n_lat)
        raw.run(("stream", "drain"), THR_BYTES, n_thr)
    tile_latency(a, b, n_lat)
    tile_stream(a, b, n_thr)
    for _ in range(reps):
        for name, raw in raws.items():
            out[f"{name}_lat"].append(raw.run(("ping", "pong"), LAT_BYTES, n_lat) / n_lat)
        out["tile_lat"].append(tile_latency(a, b, n_lat) / n_lat)
        for name, raw in raws.items():
            out[f"{name}_thr"].append(n_thr * THR_BYTES / raw.run(("stream", "drain"), THR_BYTES, n_thr))
        out["tile_thr"].append(n_thr * THR_BYTES / tile_stream(a, b, n_thr))
    return out


def report(m: dict[str, list[float]], ar: dict[str, tuple[float, float]], reps: int) -> None:
    from waferrt.core.spec import WSE2

    speed = {k: [1 / x for x in v] if k.endswith("lat") else v for k, v in m.items()}  # higher is better
    best = {k: max(v) for k, v in speed.items()}
    med = {k: statistics.median(v) for k, v in speed.items()}
    print(f"neighbour link between two processes, {os.cpu_count()} CPUs, {reps} interleaved repetitions")
    print(f"{'':22}{'tile actors':>12}{'raw pyzmq':>11}{'raw CURVE':>11}"
          f"{'vs raw':>8}{'(median)':>10}{'vs CURVE':>10}{'(median)':>10}")
    rows = (("4 KB round trip", "lat", lambda v: 1e6 / v, "us"),
            ("1 MB stream", "thr", lambda v: v / 1e9, "GB/s"))
    for name, key, show, unit in rows:
        t, r, c = (best[f"{pair}_{key}"] for pair in ("tile", "raw", "curve"))
        ratios = [t / r, med[f"tile_{key}"] / med[f"raw_{key}"], t / c, med[f"tile_{key}"] / med[f"curve_{key}"]]
        print(f"{name + f' ({unit})':22}{show(t):>12.1f}{show(r):>11.1f}{show(c):>11.1f}"
              + "".join(f"{x:>{w}.2f}" for x, w in zip(ratios, (8, 10, 10, 10))))
    print("tile actors: ZmqLinks (CURVE, authenticated); ratio = tile/raw speed of the best runs (1.0: as fast)")
    print("throughput goal against raw pyzmq with the same encryption (vs CURVE): >= 0.7")
    print("\nallreduce along a 1x64 row of cores (4 tile actors of 16), 1 KB per core, wse2 timings")
    print(f"{'algorithm':12}{'wall ms (median)':>18}{'modelled cycles':>18}{'modelled us':>14}")
    for algo, (wall, cycles) in ar.items():
        print(f"{algo:12}{wall * 1e3:>18.2f}{cycles:>18.0f}{cycles / WSE2.clock_hz * 1e6:>14.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages and repetitions (a smoke run)")
    args = ap.parse_args()
    n_lat, n_thr, reps = (300, 100, 3) if args.quick else (1000, 200, 11)

    import ray

    from waferrt.actors.remote import stop_tiles

    ray.init(address="local", log_to_driver=False, logging_level=logging.ERROR, include_dashboard=False)
    try:
        tiles, a, b, ipc_dir = start_probe_pair()
        raws = {"raw": RawPair(curve=False), "curve": RawPair(curve=True)}
        try:
            links = measure_links(raws, a, b, n_lat, n_thr, reps)
        finally:
            for raw in raws.values():
                raw.close()
            stop_tiles(tiles)
            shutil.rmtree(ipc_dir, ignore_errors=True)
        ar = allreduce_row(5 if args.quick else 20)
    finally:
        ray.shutdown()
    report(links, ar, reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
