"""JSON form of a Placement: plain dicts, lists, numbers and strings, and back.

Contract: ``placement_from_json(placement_to_json(p)) == p``; a dict that is not a Placement's JSON raises
ValueError naming the missing key. Regions are [x0, y0, w, h], cores [x, y], links [[x, y], [x, y]], tiles
[tx, ty]; the config, spec and nodes keep their field names.
"""

from __future__ import annotations

import dataclasses

from waferrt.core.mesh import Coord, MeshSpec, Region, TileId
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .types import KVReserve, NodeInfo, Placement


def _region(r: Region) -> list[int]:
    return [r.x0, r.y0, r.w, r.h]


def _cores(cs) -> list[list[int]]:
    return [[c.x, c.y] for c in sorted(cs)]


def placement_to_json(p: Placement) -> dict:
    m = p.mesh
    return {
        "config": dataclasses.asdict(p.config),
        "spec": p.spec.as_dict(),
        "mesh": {"width": m.width, "height": m.height, "tile_w": m.tile_w, "tile_h": m.tile_h,
                 "dead": _cores(m.dead)},
        "dtype": p.dtype,
        "kv": dataclasses.asdict(p.kv),
        "layers": [_region(r) for r in p.layers],
        "embed": _region(p.embed),
        "spare": _cores(p.spare),
        "tile_nodes": [[t.tx, t.ty, name] for t, name in p.tile_nodes],
        "kv_tokens": p.kv_tokens,
        "nodes": [dataclasses.asdict(n) for n in p.nodes],
        "dead_links": [[[a.x, a.y], [b.x, b.y]] for a, b in sorted(p.dead_links)],
        "group": p.group,
        "streaming": p.streaming,
        "experts": p.experts,
        "balance": p.balance,
        "head": None if p.head is None else _region(p.head),
    }


def placement_from_json(d: dict) -> Placement:
    """The Placement of its JSON form (raises ValueError naming a missing key)."""
    try:
        m = d["mesh"]
        return Placement(
            config=LlamaConfig(**d["config"]),
            spec=HardwareSpec.from_dict(d["spec"]),
            mesh=MeshSpec(m["width"], m["height"], m["tile_w"], m["tile_h"],
                          frozenset(Coord(x, y) for x, y in m["dead"])),
            dtype=d["dtype"],
            kv=KVReserve(**d["kv"]),
            layers=tuple(Region(*r) for r in d["layers"]),
            embed=Region(*d["embed"]),
            spare=frozenset(Coord(x, y) for x, y in d["spare"]),
            tile_nodes=tuple((TileId(tx, ty), name) for tx, ty, name in d["tile_nodes"]),
            nodes=tuple(NodeInfo(**n) for n in d["nodes"]),
            kv_tokens=int(d["kv_tokens"]),
            dead_links=frozenset((Coord(*a), Coord(*b)) for a, b in d["dead_links"]),
            group=int(d.get("group", 1)),  # JSON from before strategies: one layer per region
            streaming=bool(d.get("streaming", False)),
            experts=str(d.get("experts", "er")),
            balance=int(d.get("balance", 0)),
            head=None if d.get("head") is None else Region(*d["head"]),  # JSON from before untied heads: tied
        )
    except KeyError as e:
        raise ValueError(f"not a Placement JSON: the key {e} is missing (make one with "
                         "waferrt.scheduler.placement_to_json)") from None
