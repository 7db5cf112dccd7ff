"""Ray at the boundary: the tile actor class and how it is started.

Contract: :func:`start_tiles` starts one named Ray actor ``tile(x,y)`` per tile of the mesh (in the
given namespace, pinned to the Ray node the placement chose, BLAS limited to one thread so that tiles
do not fight over the machine's cores), wires their fabric (ipc on one node; tcp, bound on the node's
address, only for tiles with a neighbour on another node), every link authenticated with keys made for
this session (``guard.session_keys``: each tile gets its key pair and its neighbours' public keys through
Ray, nowhere else) and returns the handles. :func:`stop_tiles` closes their sockets and kills them.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from waferrt.core.mesh import Dir, MeshSpec, TileId

from .guard import session_keys
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
    keys, addresses = session_keys(mesh), {}
    for i, (t, h) in enumerate(handles.items()):
        addresses[t] = ray.get(h.bind.remote(ipc_dir, keys[t], _crosses_nodes(mesh, node_ids, t)))
        if progress:
            progress(i + 1, len(handles))
    calls = []
    for t, h in handles.items():
        peers = {}
        for d in Dir:
            n = mesh.tile_neighbour(t, d)
            if n is not None:
                same_node = node_ids.get(t) == node_ids.get(n)
                peers[d.name] = addresses[n]["ipc" if same_node else "tcp"]
        calls.append(h.connect.remote(peers))
    ray.get(calls)
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
