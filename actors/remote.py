"""Ray at the boundary: the tile actor class and how it is started.

Contract: :func:`start_tiles` starts one named Ray actor ``tile(x,y)`` per tile of the mesh (in the
given namespace, pinned to the Ray node the placement chose, BLAS limited to one thread so that tiles
do not fight over the machine's cores), wires their fabric (ipc on one node; tcp, bound on the node's
address, only for tiles with a neighbour on another node; every link authenticated: each tile makes its
own key pair and gets its neighbours' public keys through Ray before any tile connects) and returns the
handles. :func:`stop_tiles` closes their sockets and kills them.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.core.mesh import Dir, MeshSpec, TileId

from .tile import Tile

BLAS_ENV = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}

TileActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(Tile)


def start_tiles(mesh: MeshSpec, spec, namespace: str, ipc_dir: str, node_ids: dict[TileId, str],
                timeout: float, progress=None, tile_cls=TileActor) -> dict[TileId, object]:
    handles = {}
    for t in mesh.tiles():
        opts = {"name": str(t), "namespace": namespace, "runtime_env": {"env_vars": BLAS_ENV}}
        if node_ids.get(t):
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_ids[t], soft=False)
        handles[t] = tile_cls.options(**opts).remote(mesh, spec, t, timeout)
    addresses = {}
    for i, (t, h) in enumerate(handles.items()):
        addresses[t] = ray.get(h.bind.remote(ipc_dir, _crosses_nodes(mesh, node_ids, t)))
        if progress:
            progress(i + 1, len(handles))
    neighbours = {t: {d: n for d in Dir if (n := mesh.tile_neighbour(t, d)) is not None} for t in handles}
    # every tile knows its neighbours' keys before any of them connects: a refused handshake is not retried
    ray.get([h.admit.remote({d.name: addresses[n]["key"] for d, n in neighbours[t].items()})
             for t, h in handles.items()])
    ray.get([h.connect.remote({d.name: addresses[n]["ipc" if node_ids.get(t) == node_ids.get(n) else "tcp"]
                               for d, n in neighbours[t].items()})
             for t, h in handles.items()])
    return handles


def _crosses_nodes(mesh: MeshSpec, node_ids: dict[TileId, str], t: TileId) -> bool:
    """Does tile t have a neighbour tile on another Ray node (so it needs a tcp socket)?"""
    return any(n is not None and node_ids.get(n) != node_ids.get(t)
               for n in (mesh.tile_neighbour(t, d) for d in Dir))


def stop_tiles(handles: dict) -> None:
    refs = [h.close.remote() for h in handles.values()]
    try:
        ray.get(refs, timeout=10)
    except Exception:  # noqa: BLE001 - a dead tile cannot close; it is killed below anyway
        pass
    for h in handles.values():
        ray.kill(h, no_restart=True)
