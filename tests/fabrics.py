"""Real fabric links without Ray, for the unit tier (tests/ is on sys.path: `from fabrics import zmq_tiles`):
the ZmqLinks of some tiles of a mesh, in this process, wired as ``actors.remote.start_tiles`` wires tile
actors -- bind every tile, admit every tile's neighbours' keys, then connect (over ipc in `ipc_dir`)."""

from __future__ import annotations

from waferrt.core.mesh import Dir, MeshSpec


def zmq_tiles(ipc_dir: str, mesh: MeshSpec, timeout: float, limits=None) -> dict:
    from waferrt.actors.fabric import ZmqLinks

    links = {t: ZmqLinks(t, timeout, limits) for t in mesh.tiles()}
    addresses = {t: lk.bind(ipc_dir) for t, lk in links.items()}
    neighbours = {t: {d: n for d in Dir if (n := mesh.tile_neighbour(t, d)) is not None} for t in links}
    for t, lk in links.items():
        lk.admit({d: addresses[n]["key"] for d, n in neighbours[t].items()})
    for t, lk in links.items():
        lk.connect({d: addresses[n]["ipc"] for d, n in neighbours[t].items()})
    return links


def close_all(links: dict) -> None:
    for lk in links.values():
        lk.close()
