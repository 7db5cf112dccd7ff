"""Faults as data: what can fail on a wafer, where, and when it fails -- frozen values, a seeded plan.

Contract: six fault kinds, each a frozen, hashable value with a ``where`` and a ``when``:
:class:`CoreFailure` (a core's SRAM is gone; it never computes, answers or forwards again),
:class:`LinkFailure` (the link between two neighbouring cores drops everything, both ways),
:class:`Corrupt` (payloads crossing a tile border on a link get ``bits`` bit flips),
:class:`Straggler` (a tile, or the regions holding one core, run ``delay`` seconds slower per stage: slow,
not dead),
:class:`TileCrash` (the tile actor's process dies, ``os._exit`` inside it) and :class:`NodeLoss` (a Ray
node goes away with its tiles). ``when`` is a :class:`Trigger`: at micro-batch (decode step) N, at the
K-th message on the fault's link, T seconds after it is armed, or at random with a rate per step (drawn
from the plan's seed). A :class:`FaultPlan` is a seeded tuple of faults; it round-trips through JSON (and
YAML when PyYAML is installed; a file that is not valid YAML/JSON or not a plan is a ValueError naming the
line or what is missing), ``plan.check(mesh)`` (one owner: :func:`check_on_mesh`) refuses a fault whose
cores, link or tile are off the mesh, and ``FaultPlan.random(seed, n, mesh, kinds, ...)`` (or on
``Targets(mesh, cores, links, nodes)``: what the faults may hit) draws the same plan from the same seed
every time. Pure: no Ray, no sockets.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from waferrt.core.mesh import Coord, Dir, MeshSpec, TileId


class FaultKind(StrEnum):
    """What fails: its value is the word plans, logs, traces and ``--kinds`` write ("core", "link", ...)."""

    CORE = "core"
    LINK = "link"
    CORRUPT = "corrupt"
    STRAGGLER = "straggler"
    TILE = "tile"
    NODE = "node"


KINDS = tuple(FaultKind)


@dataclass(frozen=True)
class Trigger:
    """When a fault fires: the first of these that holds (0 / None: not used)."""

    step: int = 0  # at the step-th step (decode micro-batch, kernel command) the tile runs once armed
    message: int = 0  # the `message`-th message on the fault's link (Corrupt)
    seconds: float = 0.0  # this long after the fault is armed
    rate: float = 0.0  # per step, with this probability (from the plan's seed)

    def __post_init__(self) -> None:
        if min(self.step, self.message, self.seconds, self.rate) < 0 or self.rate > 1:
            raise ValueError(f"a trigger's step, message and seconds are >= 0 and its rate in [0, 1]: {self}")

    def __str__(self) -> str:
        parts = [f"{k} {v}" for k, v in dataclasses.asdict(self).items() if v]
        return ", ".join(parts) or "at once"


NOW = Trigger()


@dataclass(frozen=True)
class CoreFailure:
    core: Coord
    when: Trigger = NOW
    kind = FaultKind.CORE

    def __post_init__(self) -> None:
        _coerce(self)

    def where(self) -> str:
        return f"core {self.core}"


@dataclass(frozen=True)
class LinkFailure:
    a: Coord
    b: Coord
    when: Trigger = NOW
    kind = FaultKind.LINK

    def __post_init__(self) -> None:
        _coerce(self)
        _check_link(self.a, self.b)

    def where(self) -> str:
        return f"link {self.a}-{self.b}"


@dataclass(frozen=True)
class Corrupt:
    a: Coord  # the link a -> b (a tile border: the payloads that cross it)
    b: Coord
    bits: int = 1
    when: Trigger = NOW
    kind = FaultKind.CORRUPT

    def __post_init__(self) -> None:
        _coerce(self)
        _check_link(self.a, self.b)
        if self.bits < 1:
            raise ValueError(f"Corrupt flips at least 1 bit, got {self.bits}")

    def where(self) -> str:
        return f"link {self.a}->{self.b}"


@dataclass(frozen=True)
class Straggler:
    """Slow, not dead: a whole tile (``Straggler((1, 0), 0.01)``) runs every step -- a decode stage, or a kernel
    command once (a kernel's primitives are not steps) -- `delay` seconds slower, or one core
    (``Straggler(core=(3, 4), delay=0.01)``) holds up the stages and commands whose region holds it (its
    region's collectives wait for it). Wall time only: the modelled cost is what the primitives booked."""

    tile: TileId | None = None
    delay: float = 0.0  # seconds added to every stage the tile (or the core's region) runs
    when: Trigger = NOW
    core: Coord | None = None
    kind = FaultKind.STRAGGLER

    def __post_init__(self) -> None:
        _coerce(self)
        if (self.tile is None) == (self.core is None):
            raise ValueError("a straggler is a tile or a core: give one of them, e.g. Straggler((1, 0), 0.01) for "
                             "tile(1,0) or Straggler(core=(3, 4), delay=0.01) for core (3,4)")
        if self.delay <= 0:
            raise ValueError(f"a straggler is slower by a positive delay in seconds, got {self.delay}")

    def where(self) -> str:
        return f"{self.tile if self.core is None else f'core {self.core}'} (+{self.delay:g} s per step)"


@dataclass(frozen=True)
class TileCrash:
    tile: TileId
    when: Trigger = NOW
    kind = FaultKind.TILE

    def __post_init__(self) -> None:
        _coerce(self)

    def where(self) -> str:
        return str(self.tile)


@dataclass(frozen=True)
class NodeLoss:
    node: int  # the index of the Ray node in the cluster's list of nodes that host tiles
    when: Trigger = NOW
    kind = FaultKind.NODE

    def where(self) -> str:
        return f"Ray node {self.node}"


Fault = CoreFailure | LinkFailure | Corrupt | Straggler | TileCrash | NodeLoss
BY_KIND = {c.kind: c for c in (CoreFailure, LinkFailure, Corrupt, Straggler, TileCrash, NodeLoss)}


def _coerce(fault) -> None:
    """Let a fault be written with plain pairs: CoreFailure((3, 4)), Straggler((1, 0), 0.01)."""
    for f in dataclasses.fields(fault):
        v = getattr(fault, f.name)
        if f.name in ("core", "a", "b") and isinstance(v, (tuple, list)):
            object.__setattr__(fault, f.name, Coord(*v))
        elif f.name == "tile" and isinstance(v, (tuple, list)):
            object.__setattr__(fault, f.name, TileId(*v))


def _check_link(a: Coord, b: Coord) -> None:
    if a.hops_to(b) != 1:
        raise ValueError(f"a link joins two neighbouring cores (one N/E/S/W hop apart); {a} and {b} are "
                         f"{a.hops_to(b)} hops apart")


def link_dir(a: Coord, b: Coord) -> Dir:
    """The direction of the hop from a to b."""
    return Dir.of_step(b.x - a.x, b.y - a.y)


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple = ()
    seed: int = 0
    policy: str = "tolerant"  # "tolerant": recover; "fail-fast": the first fault ends the run
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.policy not in ("tolerant", "fail-fast"):
            raise ValueError(f"a fault plan's policy is 'tolerant' or 'fail-fast', got {self.policy!r}")
        object.__setattr__(self, "faults", tuple(self.faults))

    # -- files ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"seed": self.seed, "policy": self.policy, "faults": [fault_dict(f) for f in self.faults]}

    @classmethod
    def from_dict(cls, d: dict) -> FaultPlan:
        """The plan of `d` (as to_dict gives it); ValueError saying what is wrong and the form otherwise."""
        form = ("write a mapping with 'faults': a list of faults such as {kind: core, core: [3, 4], when: "
                "{step: 2}}, of kinds " + ", ".join(KINDS) + " (see FaultPlan.to_dict)")
        if not isinstance(d, dict) or not isinstance(d.get("faults", []), list):
            raise ValueError(f"not a fault plan (it holds {type(d).__name__} {str(d)[:40]!r}): {form}")
        try:
            return cls(tuple(fault_from(f) for f in d.get("faults", ())), int(d.get("seed", 0)),
                       d.get("policy", "tolerant"))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            why = f"unknown kind or missing field {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"not a fault plan: {why}; {form}") from None

    def save(self, path: str | Path) -> None:
        from waferrt.core.files import atomic_open

        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        else:
            text = json.dumps(self.to_dict(), indent=1)
        with atomic_open(path) as f:  # whole or not at all
            f.write(text)

    @classmethod
    def load(cls, path: str | Path) -> FaultPlan:
        """The plan in a .yaml/.yml (YAML) or any other (JSON) file; OSError when it cannot be read,
        ValueError naming the line when it is not YAML/JSON or not a plan."""
        path = Path(path)
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            try:
                return cls.from_dict(yaml.safe_load(text))
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                raise ValueError(f"not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg} (a .yaml/.yml "
                             "file is read as YAML)") from None

    def check(self, mesh: MeshSpec) -> None:
        """Every fault's cores, link and tile are on `mesh`; ValueError naming the first that is not."""
        for i, f in enumerate(self.faults):
            try:
                check_on_mesh(f, mesh)
            except ValueError as e:
                raise ValueError(f"fault {i} ({f.kind}) {e}") from None

    # -- drawing ----------------------------------------------------------------------------------------
    @classmethod
    def random(cls, seed: int, n: int, where: MeshSpec | Targets, kinds=KINDS, steps: int = 10,
               policy: str = "tolerant") -> FaultPlan:
        """`n` faults of `kinds` drawn from `seed` (the same seed, the same plan) on `where` (a mesh: any of
        its live cores, tile-border links, tiles; or :class:`Targets` narrowing them and naming the Ray
        nodes): links around the cores, tile-border links a -> b for Corrupt, nodes 1 .. nodes - 1 (node 0
        is the driver's); each fires at a step in [1, steps]."""
        rng = random.Random(seed)
        t = where if isinstance(where, Targets) else Targets(where)
        mesh, nodes = t.mesh, t.nodes
        cores = sorted(t.cores if t.cores is not None else set(mesh.region.cores()) - mesh.dead)
        kinds = [FaultKind(k) for k in kinds]
        links = sorted(t.links if t.links is not None else border_links(mesh)) if FaultKind.CORRUPT in kinds else []
        kinds = [k for k in kinds if (k is not FaultKind.NODE or nodes > 1) and (k is not FaultKind.CORRUPT or links)]
        if not kinds:
            raise ValueError("no fault kind left to draw (node losses need more than one Ray node, Corrupt a "
                             "link between two tiles)")
        where = Targets(mesh, tuple(cores), tuple(links), nodes)
        faults = [_draw(rng, rng.choice(kinds), where, Trigger(step=rng.randint(1, steps))) for _ in range(n)]
        return cls(tuple(faults), seed, policy)


@dataclass(frozen=True)
class Targets:
    """What drawn faults may hit: the mesh (its tiles), the cores (None: every live core of the mesh), the
    tile-border links a -> b for Corrupt (None: every one of the mesh), and Ray nodes 1 .. nodes - 1."""

    mesh: MeshSpec
    cores: tuple | None = None
    links: tuple | None = None
    nodes: int = 1

    def __post_init__(self) -> None:
        for name in ("cores", "links"):  # any collection in, a hashable tuple kept (in a stable order)
            got = getattr(self, name)
            if got is not None and not isinstance(got, tuple):
                object.__setattr__(self, name, tuple(sorted(got)))
        if self.nodes < 1:
            raise ValueError(f"faults are drawn over at least 1 Ray node (node 0, the driver's), got {self.nodes}")


def _draw(rng: random.Random, kind: FaultKind, where: Targets, when: Trigger):
    mesh, cores, links, nodes = where.mesh, where.cores, where.links, where.nodes
    if kind is FaultKind.CORE:
        return CoreFailure(rng.choice(cores), when)
    if kind is FaultKind.LINK:
        a = rng.choice(cores)
        b = rng.choice([c for d in Dir if mesh.region.contains(c := a.step(d))] or [a.step(Dir.E)])
        return LinkFailure(a, b, when)
    if kind is FaultKind.CORRUPT:
        a, b = rng.choice(links)
        return Corrupt(a, b, rng.randint(1, 3), when)
    if kind is FaultKind.STRAGGLER:
        delay = round(rng.uniform(0.005, 0.05), 4)
        if rng.random() < 0.5:  # one slow core holds up its region
            return Straggler(None, delay, when, core=rng.choice(cores))
        return Straggler(rng.choice(mesh.tiles()), delay, when)
    if kind is FaultKind.TILE:
        return TileCrash(rng.choice(mesh.tiles()), when)
    return NodeLoss(rng.randrange(1, nodes), when)  # never node 0: the driver's


def check_on_mesh(fault, mesh: MeshSpec) -> None:
    """The fault's cores (a link's two), or its tile, are on `mesh`; ValueError naming them otherwise."""
    core = getattr(fault, "core", None)  # a CoreFailure's, a core Straggler's
    cores = [core] if core is not None else [fault.a, fault.b] if hasattr(fault, "a") else []
    for c in cores:
        if not mesh.region.contains(c):
            where = "" if c == core else f"{fault.where()}: "  # a link names the core of it that is off
            raise ValueError(f"{where}core {c} is not on the {mesh.width}x{mesh.height} mesh (cores "
                             f"{Coord(0, 0)}..{Coord(mesh.width - 1, mesh.height - 1)})")
    tile = getattr(fault, "tile", None)
    if tile is not None and tile not in mesh.tiles():
        raise ValueError(f"{fault.where()}: {tile} is not a tile of the mesh {mesh}")


def fault_tiles(fault, mesh: MeshSpec) -> list[TileId]:
    """The tiles that carry out `fault` (none for a NodeLoss: the host removes the node)."""
    if getattr(fault, "core", None) is not None:  # a CoreFailure, a Straggler of one core
        return [mesh.tile_of(fault.core)]
    if isinstance(fault, LinkFailure):
        return sorted({mesh.tile_of(fault.a), mesh.tile_of(fault.b)})
    if isinstance(fault, Corrupt):
        if mesh.tile_of(fault.a) == mesh.tile_of(fault.b):
            raise ValueError(f"Corrupt flips bits on a link between two tiles; {fault.a}->{fault.b} lies inside "
                             f"{mesh.tile_of(fault.a)} (see waferrt.faults.model.border_links)")
        return [mesh.tile_of(fault.a)]
    if isinstance(fault, NodeLoss):
        return []
    if fault.tile not in mesh.tiles():
        raise ValueError(f"{fault.tile} is not a tile of the mesh {mesh}")
    return [fault.tile]


def border_links(mesh: MeshSpec, crossings=None) -> list[tuple[Coord, Coord]]:
    """Every link a -> b between two cores of neighbouring tiles (what crosses the fabric between tiles), or
    only those leaving tile t toward d for (t, d) in `crossings`."""
    out = []
    for t in mesh.tiles():
        r = mesh.tile_region(t)
        for d in Dir:
            n = mesh.tile_neighbour(t, d)
            if n is None or (crossings is not None and (t, d) not in crossings):
                continue
            edge = [c for c in r.cores() if not r.contains(c.step(d))]
            out += [(c, c.step(d)) for c in edge]
    if not out:
        raise ValueError(f"the mesh {mesh} has one tile: no link crosses a tile border")
    return out


def fault_dict(f) -> dict:
    """A fault as plain data (JSON, msgpack)."""
    d = {"kind": f.kind.value}
    for fld in dataclasses.fields(f):
        v = getattr(f, fld.name)
        if isinstance(v, Coord):
            v = [v.x, v.y]
        elif isinstance(v, TileId):
            v = [v.tx, v.ty]
        elif isinstance(v, Trigger):
            v = {k: x for k, x in dataclasses.asdict(v).items() if x}
        elif v is None:  # a Straggler's tile or core, whichever it is not
            continue
        d[fld.name] = v
    return d


def fault_from(d: dict):
    """The fault that fault_dict gave `d` for."""
    cls = BY_KIND[d["kind"]]
    args = {}
    for fld in dataclasses.fields(cls):
        if fld.name not in d:
            continue
        v = d[fld.name]
        if fld.name in ("core", "a", "b"):
            v = Coord(*v)
        elif fld.name == "tile":
            v = TileId(*v)
        elif fld.name == "when":
            v = Trigger(**v)
        args[fld.name] = v
    return cls(**args)
