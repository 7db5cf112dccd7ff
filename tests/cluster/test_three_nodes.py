"""Three Ray nodes on one machine: the planner keeps neighbouring tiles on one node, only the tile borders
between nodes go over tcp, and a decode spread over all three gives the single-node tokens; a worker node
lost in the middle of a decode is recovered from with the same tokens, the driver's own node is refused.

Like tests/cluster/test_cluster.py, ``ray.cluster_utils.Cluster`` runs in a subprocess with a private
RAY_TMPDIR (a head and two worker nodes, one CPU each), so it never meets the test session's Ray. The tiny
model is planned on 3x2 tiles of 8x8 cores over the three nodes (``scheduler.plan`` with three
NodeInfo): each node gets a contiguous run of two tiles. The script decodes on the tile actors, asks every
tile where it runs (a kernel) and where it sends (``Tile.fabric_stats()["peers"]``: each neighbour's
address), and lists the named actors (what ``ray list actors`` and the dashboard show). Then, on the same
tiles, the decode again under a TileCrash of a tile on a worker node (found by a ping when its neighbours'
links drop, before its heartbeat falls silent), under a NodeLoss of worker node 2 at the 5th token
(``Cluster.remove_node`` without a graceful shutdown: its raylet is killed, the workers it leaves running a
moment are ended by the host) and again at the 7th (nothing more to do), and under a NodeLoss of node 0,
the driver's own (never carried out: ``Unrecoverable`` says why). Takes ~60 s.
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
import ray
from ray.cluster_utils import Cluster
from waferrt.actors.tile import Tile
from waferrt.core.mesh import MeshSpec, TileId
from waferrt.core.spec import TINY
from waferrt.faults import FaultPlan, NodeLoss, TileCrash, Trigger, Unrecoverable
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.runtime import ray_init
from waferrt.scheduler import KVReserve, NodeInfo, PlanOptions, plan
from waferrt.serving import GenRequest, generate_reference

from waferrt.actors.session import token_auth_for_what_starts_here
token_auth_for_what_starts_here()  # the nodes require Ray's token (cluster_utils does not ask for it)
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
report = {}
try:
    assert ray_init(cluster.address)
    cluster.wait_for_nodes()
    nodes = [cluster.head_node, *workers]
    ids = [n.node_id for n in nodes]
    report["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
    config = tiny_config()
    weights = synthetic_llama(config, seed=2)
    placement = plan(config, TINY, MeshSpec(24, 16, 8, 8), kv=KVReserve(32, 2),
                     options=PlanOptions(nodes=tuple(NodeInfo(i, 1) for i in ids)))
    report["tile_nodes"] = {str(t): ids.index(n) for t, n in placement.tile_nodes}
    requests = [GenRequest((5, 6, 7), 10), GenRequest((9,), 12), GenRequest((1, 2), 8)]
    sampler = Sampler(temperature=0.8, seed=3)
    want, _ = generate_reference(config, weights, requests, sampler)
    place = dict(placement.tile_nodes)

    def on_its_node(ctx, place):  # every tile checks that it runs on the node the planner gave it
        import ray
        tile = TileId(ctx.local.x0 // 8, ctx.local.y0 // 8)
        here = ray.get_runtime_context().get_node_id()
        assert here == place[tile], f"{tile} runs on node {here}, was placed on {place[tile]}"

    with WaferLLM(config, weights, placement) as llm:
        got, _ = llm.generate(requests, sampler)
        llm.wafer.run(on_its_node, place=place)
        stats = llm.wafer.on_every_tile(Tile.fabric_stats)
        report["links"] = {s["tile"]: {d: a.split("://")[0] for d, a in s["peers"].items()} for s in stats}
        report["tcp_bound"] = {s["tile"]: s["endpoints"]["tcp"] is not None for s in stats}
        report["named"] = sorted((a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True))
        report["decode"] = [c.tokens for c in got] == [c.tokens for c in want]

        remote = next(t for t in llm.setup.stage_tiles() if llm.wafer.nodes[t] != ids[0] and t != llm.head)
        with llm.faults(FaultPlan((TileCrash(remote, Trigger(step=3)),))):
            got, stats = llm.generate(requests, sampler)
        report["remote_crash"] = {"tokens": [c.tokens for c in got] == [c.tokens for c in want],
                                  "events": [e.as_dict() for e in stats.faults]}

        def lose(i):  # the node goes at once: its raylet and Ray's processes are killed, no graceful shutdown
            cluster.remove_node(nodes[i], allow_graceful=False)

        with llm.faults(FaultPlan((NodeLoss(2, Trigger(step=5)), NodeLoss(2, Trigger(step=7)))), node_loss=lose):
            got, stats = llm.generate(requests, sampler)
        report["node_loss"] = {"tokens": [c.tokens for c in got] == [c.tokens for c in want],
                               "events": [e.as_dict() for e in stats.faults],
                               "moved_to": {str(t): ids.index(n) for t, n in llm.wafer.nodes.items()}}
        try:
            with llm.faults(FaultPlan((NodeLoss(0, Trigger(step=3)),)), node_loss=lose):
                llm.generate(requests, sampler)
        except Unrecoverable as e:
            report["driver_node"] = str(e)
        report["alive_after"] = len({n["NodeID"] for n in ray.nodes() if n["Alive"]} - {nodes[2].node_id})
finally:
    ray.shutdown()
    cluster.shutdown()
print(json.dumps(report))
"""

STEP = {"N": (0, -1), "S": (0, 1), "E": (1, 0), "W": (-1, 0)}


def _tile(name: str) -> tuple[int, int]:
    x, y = name[len("tile("):-1].split(",")
    return int(x), int(y)


def _connected(tiles: list[tuple[int, int]]) -> bool:
    seen, todo = {tiles[0]}, [tiles[0]]
    while todo:
        x, y = todo.pop()
        for dx, dy in STEP.values():
            if (x + dx, y + dy) in tiles and (x + dx, y + dy) not in seen:
                seen.add((x + dx, y + dy))
                todo.append((x + dx, y + dy))
    return seen == set(tiles)


@pytest.fixture(scope="module")
def run() -> tuple[dict, str]:
    """The script's report, and everything else it printed (stdout and stderr)."""
    tmp = tempfile.mkdtemp(prefix="wrt-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WAFERRT_KEEP_TILES")}  # named tiles
    env.update(TMPDIR=tmp, RAY_TMPDIR=tmp)
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    *printed, last = proc.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed) + proc.stderr


@pytest.mark.cluster
def test_three_nodes_neighbours_together_tcp_only_across_nodes(run):
    report, _ = run
    assert report["nodes"] == 3 and report["decode"], report
    node = {_tile(t): n for t, n in report["tile_nodes"].items()}
    for n in range(3):  # every node holds a contiguous run of two tiles: neighbours share a node
        mine = [t for t, m in node.items() if m == n]
        assert len(mine) == 2 and _connected(mine), node
    crossing = 0
    for name, links in report["links"].items():
        x, y = _tile(name)
        assert set(links) == {d for d, (dx, dy) in STEP.items() if (x + dx, y + dy) in node}, (name, links)
        for d, kind in links.items():
            other = node[(x + STEP[d][0], y + STEP[d][1])] != node[(x, y)]
            assert kind == ("tcp" if other else "ipc"), f"{name}'s {d} link is {kind}"
            crossing += other
        assert report["tcp_bound"][name] == ("tcp" in links.values()), name  # tcp bound only where needed
    assert crossing >= 2 * 2  # both ends of at least two borders between nodes
    names = [n for n, _ in report["named"]]
    assert sorted(names) == sorted(f"tile({x},{y})" for x, y in node), report["named"]
    assert len({ns for _, ns in report["named"]}) == 1 and report["named"][0][1].startswith("waferrt-")


@pytest.mark.cluster
def test_a_lost_worker_node_is_recovered_from_with_the_same_tokens(run):
    report, printed = run
    lost = report["node_loss"]
    assert lost["tokens"], "tokens after the node loss != the fault-free run's"
    event, again = lost["events"]
    assert event["kind"] == "node" and event["step"] >= 5 and event["outcome"] == "recovered", event
    assert again["action"] == "none needed: the node was lost already", again  # the same node, a second time
    on_node_2 = [t for t, n in report["tile_nodes"].items() if n == 2]
    assert len(on_node_2) == 2 and all(t in event["action"] for t in on_node_2), event  # restarted, both
    assert set(lost["moved_to"].values()) == {0, 1}, lost["moved_to"]  # on the live nodes now
    assert "(raylet)" not in printed and "Raylet" not in printed, printed[-2000:]  # Ray's messages: a logger's


@pytest.mark.cluster
def test_a_tile_crash_on_another_node_is_seen_before_its_heartbeat_falls_silent(run):
    """Its neighbours' links drop; the host pings the tiles on other nodes and Ray answers with the actor's
    death: found by Ray's answer, not by the heartbeat falling silent (STALL_S) -- which on a loaded machine
    comes seconds after the crash too, so the finder, not a wall-clock bound, tells them apart -- and recovered
    with the same tokens."""
    report, _ = run
    crash = report["remote_crash"]
    (event,) = crash["events"]
    assert crash["tokens"] and event["outcome"] == "recovered", crash
    assert event["detected_by"] == "Ray: actor died", crash


@pytest.mark.cluster
def test_losing_the_drivers_own_node_is_refused_as_unrecoverable(run):
    report, _ = run
    assert report["driver_node"].startswith("Ray node 0 (") and "this driver's own node" in report["driver_node"]
    assert "not removed" in report["driver_node"] and "lose one of nodes 1, 2" in report["driver_node"]
    assert report["alive_after"] == 2  # the head and node 1 still up: the refusal removed nothing
