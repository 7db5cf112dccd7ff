"""Ray at the boundary: the tile actor class and how it is started.

Contract: a :class:`TileLaunch` is what every tile of a Wafer starts from (frozen, checked: every tile has
a node). :func:`start_tiles` starts one named Ray actor ``tile(x,y)`` per tile of the mesh (in the
given namespace, pinned to the Ray node the placement chose, BLAS limited to one thread so that tiles
do not fight over the machine's cores), wires their fabric (ipc on one node; tcp, bound on the node's
address, only for tiles with a neighbour on another node; every link authenticated: each tile makes its
own key pair and gets its neighbours' public keys through Ray before any tile connects), points their
heartbeats at the host's inbox and returns the handles. :func:`restart_tiles` replaces dead tiles by new
actors and rewires their neighbours to them. :func:`stop_tiles` closes their sockets and kills them
(or, while tiles are kept, hands those that retired cleanly to waferrt.actors.pool, whose kept tiles
:func:`start_tiles` and :func:`restart_tiles` take first); :func:`kill_tiles` kills them at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.core.mesh import Dir, MeshSpec, TileId

from .pool import POOL, keep_limit
from .session import BLAS_ENV, NodesGone, workers_inherit_blas_env
from .tile import Tile

CALL_S = 60.0  # the longest a start-up or wiring step may take

TileActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(Tile)


@dataclass(frozen=True, eq=False)
class TileLaunch:
    """Where and how a Wafer's tile actors start: its mesh and spec, its Ray namespace and ipc directory, the
    Ray node of every tile, the deadline of a tile's calls, the host inbox's addresses ("ipc", "tcp") and
    the actor class."""

    mesh: MeshSpec
    spec: object
    namespace: str
    ipc_dir: str
    node_ids: Mapping[TileId, str]
    timeout: float
    host: Mapping[str, str]
    tile_cls: object = TileActor

    def __post_init__(self) -> None:
        missing = [str(t) for t in self.mesh.tiles() if t not in self.node_ids]
        if missing:
            raise ValueError(f"TileLaunch: {', '.join(missing[:4])} have no Ray node; give every tile of the "
                             f"{self.mesh} mesh one")
        if not self.timeout > 0:
            raise ValueError(f"TileLaunch.timeout must be positive seconds, got {self.timeout!r}")


def driver_node() -> str:
    """The Ray node this driver runs on."""
    return ray.get_runtime_context().get_node_id()


def alive_nodes() -> set[str]:
    """The Ray nodes that are alive now."""
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def start_tiles(launch: TileLaunch, progress=None) -> dict[TileId, object]:
    """Start every tile pinned to its node, wire the fabric, and point each tile's heartbeat and events at
    the host inbox. A node that is not alive in this cluster raises NodesGone naming it and its tiles,
    before any tile starts."""
    mesh, node_ids = launch.mesh, launch.node_ids
    _check_nodes(node_ids)
    handles = {t: _start(launch, t) for t in mesh.tiles()}
    addresses = _bind(handles, mesh, launch.ipc_dir, node_ids, progress)
    _wire(mesh, handles, set(handles), addresses, node_ids, launch.host)
    return handles


def _check_nodes(node_ids: dict[TileId, str]) -> None:
    alive = alive_nodes()
    gone = sorted({n for n in node_ids.values() if n not in alive})
    if gone:
        tiles = ", ".join(str(t) for t, n in sorted(node_ids.items()) if n in gone)
        raise NodesGone(f"the placement puts {tiles} on Ray node(s) {', '.join(n[:12] for n in gone)}, which this "
                        f"cluster does not have (its {len(alive)} live node(s): "
                        f"{', '.join(sorted(n[:12] for n in alive))}): plan again on the cluster's nodes "
                        "(waferrt plan --address ..., or scheduler.plan(options=PlanOptions(nodes=...)))")


def restart_tiles(launch: TileLaunch, handles: dict, dead: list[TileId]) -> dict[TileId, object]:
    """Replace the `dead` tiles by new actors (on their nodes in the launch), wired to their neighbours,
    which admit the new keys and link to the new sockets; returns every tile's handle. The new tiles hold
    nothing yet."""
    mesh, node_ids = launch.mesh, launch.node_ids
    kill_tiles([handles[t] for t in dead])
    new = {t: _start(launch, t) for t in dead}
    addresses = _bind(new, mesh, launch.ipc_dir, node_ids)
    around = sorted({n for t in dead for n in _neighbours(mesh, t).values() if n not in new})
    addresses.update(zip(around, ray.get([handles[n].address.remote() for n in around], timeout=CALL_S)))
    handles = {**handles, **new}
    _wire(mesh, handles, set(new), addresses, node_ids, launch.host)
    return handles


def _start(launch: TileLaunch, t: TileId):
    """Tile t's actor, pinned to its node (a worker Ray starts for it gets one BLAS thread): a kept one made
    new (actors.pool) when the pool holds one there, else a new actor, named ``tile(x,y)`` unless tiles are
    kept. A name that a killed actor still holds is retried for a while."""
    node = launch.node_ids[t]
    if launch.tile_cls is TileActor:
        while (kept := POOL.take(node)) is not None:
            try:
                ray.get(kept.reset.remote(launch.mesh, launch.spec, t, launch.timeout), timeout=CALL_S)
                return kept
            except Exception:  # noqa: BLE001 - a kept tile that died or hangs is dropped; the next one is tried
                ray.kill(kept, no_restart=True)
    named = {} if keep_limit() else {"name": str(t), "namespace": launch.namespace}
    opts = {**named, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
    if not (workers_inherit_blas_env() and node == driver_node()):
        opts["runtime_env"] = {"env_vars": BLAS_ENV}
    deadline = time.monotonic() + CALL_S
    while True:
        try:
            return launch.tile_cls.options(**opts).remote(launch.mesh, launch.spec, t, launch.timeout)
        except ValueError:  # "the actor name is taken": the killed one's name is released shortly
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _bind(handles: dict, mesh: MeshSpec, ipc_dir: str, node_ids: dict, progress=None) -> dict:
    """Every tile of `handles` binds its receive socket (the tiles start side by side; counted as they come
    up): their addresses and public keys."""
    binds = {h.bind.remote(ipc_dir, _crosses_nodes(mesh, node_ids, t)): t for t, h in handles.items()}
    addresses, pending = {}, list(binds)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=CALL_S)
        if not ready:
            raise TimeoutError(f"tile actors {sorted(binds[r] for r in pending)} did not start within {CALL_S:.0f}s")
        addresses[binds[ready[0]]] = ray.get(ready[0])
        if progress:
            progress(len(addresses), len(handles))
    return addresses


def _neighbours(mesh: MeshSpec, t: TileId) -> dict[Dir, TileId]:
    return {d: n for d in Dir if (n := mesh.tile_neighbour(t, d)) is not None}


def _wire(mesh: MeshSpec, handles: dict, fresh: set, addresses: dict, node_ids: dict, host: dict) -> None:
    """Link the `fresh` tiles to their neighbours (the others are wired already; those next to a fresh tile
    are rewired to it). Every tile knows its neighbours' keys before any of them connects: a refused
    handshake is not retried."""
    here = driver_node()

    def kind(a: TileId, b: TileId) -> str:
        return "ipc" if node_ids[a] == node_ids[b] else "tcp"

    ray.get([handles[t].admit.remote({d.name: addresses[n]["key"] for d, n in _neighbours(mesh, t).items()})
             for t in fresh], timeout=CALL_S)
    ray.get([handles[n].rewire.remote(d.opposite.name, addresses[t]["key"], addresses[t][kind(n, t)])
             for t in fresh for d, n in _neighbours(mesh, t).items() if n not in fresh], timeout=CALL_S)
    ray.get([handles[t].connect.remote({d.name: addresses[n][kind(t, n)] for d, n in _neighbours(mesh, t).items()},
                                       host["ipc" if node_ids[t] == here else "tcp"]) for t in fresh], timeout=CALL_S)


def _crosses_nodes(mesh: MeshSpec, node_ids: dict[TileId, str], t: TileId) -> bool:
    """Does tile t have a neighbour tile on another Ray node (so it needs a tcp socket)?"""
    return any(n is not None and node_ids.get(n) != node_ids.get(t)
               for n in (mesh.tile_neighbour(t, d) for d in Dir))


def stop_tiles(handles: dict, patience: float = 10.0, nodes: Mapping[TileId, str] | None = None) -> None:
    """Ask every tile to close its sockets (for up to `patience` seconds), then kill them all -- or, given each
    tile's Ray `nodes` while tiles are kept (actors.pool), keep those that retired cleanly and kill the rest."""
    try:
        keeping = nodes is not None and keep_limit() > 0
    except ValueError:  # a bad WAFERRT_KEEP_TILES, refused when the Wafer opened: close as without it
        keeping = False
    if not keeping:
        refs = [h.close.remote() for h in handles.values()]
        try:
            ray.get(refs, timeout=patience)
        except Exception:  # noqa: BLE001 - a dead tile cannot close; it is killed below anyway
            pass
        kill_tiles(handles.values())
        return
    refs = {h.retire.remote(): t for t, h in handles.items()}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=patience)
    kept = set()
    for ref in ready:
        try:
            clean = ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - a tile that failed to retire is killed below
            continue
        if clean is True and POOL.give(nodes[refs[ref]], handles[refs[ref]]):
            kept.add(refs[ref])
    kill_tiles(h for t, h in handles.items() if t not in kept)


def kill_tiles(handles) -> None:
    """End these tile actors now, never to be restarted by Ray (one that is gone already is no error)."""
    for h in handles:
        ray.kill(h, no_restart=True)
