"""Ray at the boundary: the tile actor class and how it is started.

Contract: :func:`start_tiles` starts one named Ray actor ``tile(x,y)`` per tile of the mesh (in the
given namespace, pinned to the Ray node the placement chose, BLAS limited to one thread so that tiles
do not fight over the machine's cores), wires their fabric (ipc on one node; tcp, bound on the node's
address, only for tiles with a neighbour on another node; every link authenticated: each tile makes its
own key pair and gets its neighbours' public keys through Ray before any tile connects), points their
heartbeats at the host's inbox and returns the handles. :func:`stop_tiles` closes their sockets and kills
them.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.core.mesh import Dir, MeshSpec, TileId

from .session import BLAS_ENV, workers_inherit_blas_env
from .tile import Tile

TileActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(Tile)


def driver_node() -> str:
    """The Ray node this driver runs on."""
    return ray.get_runtime_context().get_node_id()


def start_tiles(mesh: MeshSpec, spec, namespace: str, ipc_dir: str, node_ids: dict[TileId, str],
                timeout: float, host: dict, progress=None, tile_cls=TileActor) -> dict[TileId, object]:
    """Start every tile pinned to its node in `node_ids` (every tile must have one), wire the fabric, and
    point each tile's heartbeat and events at the host inbox (`host`: its "ipc" and "tcp" addresses)."""
    handles, here, inherit = {}, driver_node(), workers_inherit_blas_env()
    for t in mesh.tiles():
        opts = {"name": str(t), "namespace": namespace,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node_ids[t], soft=False)}
        if not (inherit and node_ids[t] == here):  # a worker Ray starts for it gets one BLAS thread
            opts["runtime_env"] = {"env_vars": BLAS_ENV}
        handles[t] = tile_cls.options(**opts).remote(mesh, spec, t, timeout)
    binds = {h.bind.remote(ipc_dir, _crosses_nodes(mesh, node_ids, t)): t for t, h in handles.items()}
    addresses, pending = {}, list(binds)
    while pending:  # the tiles start side by side; count them as they come up
        ready, pending = ray.wait(pending, num_returns=1)
        addresses[binds[ready[0]]] = ray.get(ready[0])
        if progress:
            progress(len(addresses), len(handles))
    neighbours = {t: {d: n for d in Dir if (n := mesh.tile_neighbour(t, d)) is not None} for t in handles}
    # every tile knows its neighbours' keys before any of them connects: a refused handshake is not retried
    ray.get([h.admit.remote({d.name: addresses[n]["key"] for d, n in neighbours[t].items()})
             for t, h in handles.items()])
    ray.get([h.connect.remote({d.name: addresses[n]["ipc" if node_ids[t] == node_ids[n] else "tcp"]
                               for d, n in neighbours[t].items()}, host["ipc" if node_ids[t] == here else "tcp"])
             for t, h in handles.items()])
    return handles


def _crosses_nodes(mesh: MeshSpec, node_ids: dict[TileId, str], t: TileId) -> bool:
    """Does tile t have a neighbour tile on another Ray node (so it needs a tcp socket)?"""
    return any(n is not None and node_ids.get(n) != node_ids.get(t)
               for n in (mesh.tile_neighbour(t, d) for d in Dir))


def stop_tiles(handles: dict, patience: float = 10.0) -> None:
    """Ask every tile to close its sockets (for up to `patience` seconds), then kill them all."""
    refs = [h.close.remote() for h in handles.values()]
    try:
        ray.get(refs, timeout=patience)
    except Exception:  # noqa: BLE001 - a dead tile cannot close; it is killed below anyway
        pass
    for h in handles.values():
        ray.kill(h, no_restart=True)
