"""Two Ray nodes on one machine: tiles pinned to nodes, tcp links across the node border, results = numpy.

``ray.cluster_utils.Cluster`` starts a head and a worker node (separate raylets) in a subprocess, with a
private RAY_TMPDIR (the Cluster writes its address there; nothing else on the machine may pick it up), so it
never meets the test session's Ray. The 4x2 mesh has two tiles of 2x2 cores: tile(0,0) on the head node,
tile(1,0) on the worker node, through ``Wafer.open(node_ids=...)``. Inside the kernels, each tile checks that
it runs on its node and that its link to the other tile is tcp to that node's IP; a foreign peer then
attacks tile(0,0)'s tcp port (a port scanner, garbage, a zmq peer with its own CURVE key: all refused at
the handshake and counted, nothing dropped because nothing got in); then collectives whose lines cross
the node border must match numpy, and a small LLM placed over both nodes (the scheduler's
tile -> node map) decodes the reference's tokens. Takes ~20 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

SCRIPT = r"""
import json
import numpy as np, ray
from ray.cluster_utils import Cluster
from waferrt.actors.tile import Tile
from waferrt.core.mesh import MeshSpec, TileId
from waferrt.runtime import Wafer, ray_init

def attack_tcp(wafer):  # a foreign peer on tile(0,0)'s tcp port: a port scanner, garbage, its own CURVE key
    import socket, time, zmq
    (stats,) = wafer.call([(TileId(0, 0), Tile.fabric_stats, ())])
    host, port = stats["endpoints"]["tcp"][len("tcp://"):].rsplit(":", 1)
    for data in (b"GET / HTTP/1.0\r\n\r\n", bytes(range(256)) * 64):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            try:
                s.sendall(data)
                s.recv(64)
            except OSError:
                pass
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.curve_publickey, push.curve_secretkey = zmq.curve_keypair()
    push.curve_serverkey = stats["public_key"].encode()
    push.connect(stats["endpoints"]["tcp"])
    push.send(b"forged", zmq.NOBLOCK)
    time.sleep(1)
    ctx.destroy(0)
    return stats


from waferrt.actors.session import token_auth_for_what_starts_here
token_auth_for_what_starts_here()  # the nodes require Ray's token (cluster_utils does not ask for it)
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
worker = cluster.add_node(num_cpus=1)
report = {}
try:
    assert ray_init(cluster.address)  # joins through the address check (a real GCS answers it)
    cluster.wait_for_nodes()
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    place = {TileId(0, 0): cluster.head_node.node_id, TileId(1, 0): worker.node_id}
    report["nodes"] = len(nodes)
    mesh = MeshSpec(4, 2, 2, 2)
    wafer = Wafer(spec="tiny", mesh=mesh).open(node_ids=place)
    try:
        x = np.random.default_rng(5).standard_normal((2, 4, 6)).astype(np.float32)
        for name in ("x", "y"):
            wafer.dsm.alloc(name, x.shape, split=("y", "x", None))
        wafer.dsm.put("x", x)

        def where(ctx, place, nodes):
            import ray, zmq
            tile = TileId(ctx.local.x0 // 2, 0)
            here = ray.get_runtime_context().get_node_id()
            assert here == place[tile], f"{tile} runs on node {here}, was pinned to {place[tile]}"
            peer = place[TileId(1 - tile.tx, 0)]
            (sock,) = ctx.x.links.push.values()
            endpoint = sock.get(zmq.LAST_ENDPOINT).decode()
            assert endpoint.startswith(f"tcp://{nodes[peer]}:"), f"{tile} links to {endpoint}"
            ctx.store("y", np.full(ctx.shape + (1, 1, 6), tile.tx + 1, np.float32))  # blocks (1, 1, 6)

        wafer.run(where, place=place, nodes=nodes)
        report["where"] = wafer.dsm.get("y")[:, :, 0].tolist()
        before = attack_tcp(wafer)
        for algo in ("ktree", "ring", "pipeline"):
            wafer.run(lambda ctx, algo: ctx.store("y", ctx.allreduce(ctx.load("x"), "x", algo)), algo=algo)
            ok = np.allclose(wafer.dsm.get("y"), np.broadcast_to(x.sum(1, keepdims=True), x.shape), atol=1e-5)
            report[algo] = bool(ok)
        wafer.run(lambda ctx: ctx.store("y", ctx.shift(ctx.load("x"), "x", 1, wrap=True)))
        report["shift"] = bool(np.array_equal(wafer.dsm.get("y"), np.roll(x, 1, axis=1)))
        (after,) = wafer.call([(TileId(0, 0), Tile.fabric_stats, ())])
        report["tcp_attack"] = {k: after[k] - before[k] for k in ("refused", "zap_denied")}
        report["tcp_dropped"] = after["dropped"]
    finally:
        wafer.close()

    # LLM decode with its layers on both nodes: the activations cross the node border over tcp
    from waferrt.llm import WaferLLM
    from waferrt.serving import GenRequest, generate_reference
    from waferrt.model import Sampler, synthetic_llama, tiny_config
    from waferrt.scheduler import KVReserve, NodeInfo, PlanOptions, plan
    from waferrt.core.spec import TINY

    config = tiny_config()
    weights = synthetic_llama(config, seed=2)
    nodes = (NodeInfo(cluster.head_node.node_id, 1), NodeInfo(worker.node_id, 1))
    placement = plan(config, TINY, MeshSpec(16, 8, 8, 8), kv=KVReserve(32, 2), options=PlanOptions(nodes=nodes))
    report["decode_nodes"] = len({name for _, name in placement.tile_nodes})
    requests = [GenRequest((5, 6, 7), 10), GenRequest((9,), 12)]
    want, _ = generate_reference(config, weights, requests, Sampler(temperature=0.8, seed=3))
    with WaferLLM(config, weights, placement) as llm:
        got, _ = llm.generate(requests, Sampler(temperature=0.8, seed=3))
    report["decode"] = [c.tokens for c in got] == [c.tokens for c in want]
finally:
    ray.shutdown()
    cluster.shutdown()
print(json.dumps(report))
"""


@pytest.mark.cluster
def test_allreduce_across_two_ray_nodes_matches_numpy():
    tmp = tempfile.mkdtemp(prefix="wrt-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TMPDIR=tmp, RAY_TMPDIR=tmp)
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                              timeout=180)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 2
    assert report["where"] == [[1, 1, 2, 2], [1, 1, 2, 2]]  # tile(0,0) on the head, tile(1,0) on the worker
    assert report == {**report, "ktree": True, "ring": True, "pipeline": True, "shift": True}
    attack = report["tcp_attack"]  # refused at the handshake, counted; nothing reached the tile's queue
    assert attack["refused"] >= 3 and attack["zap_denied"] >= 1 and report["tcp_dropped"] == {}, report
    assert report["decode_nodes"] == 2 and report["decode"], "LLM decode across two nodes != the reference"
