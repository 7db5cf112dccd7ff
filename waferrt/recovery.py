"""What the host does when a fault hits a decode on the tile actors: find what died, re-plan, restart, reload.

Contract: :func:`recover` (``WaferLLM``'s decode calls it with the error that ended an attempt) returns the
stage runs the surviving tiles booked before the fault, after it has
1. found what died: the tiles that do not answer (dead, frozen, on a lost node) and, from every tile that
   answers, its dead cores and links and the faults that fired on it (the log records when each was
   found, and by what: the error's kind; a tile that died with no fault injected is logged as a TileCrash);
2. ended the surviving tiles' decode loops;
3. re-planned the damaged regions onto spare or free cores with the fewest moves
   (waferrt.scheduler.repair.replan) -- or raised :class:`~waferrt.faults.errors.Unrecoverable` saying what
   died and what would be needed;
4. restarted the dead tiles as new actors (on their node, or next to a neighbour when their node is
   gone), rewired to their neighbours, and armed on them again the faults that had not fired;
5. set the decode up again on every tile (the stages that did not move keep their weights) and sent the
   weights of the others from the host's copy (as Cerebras' MemoryX streams them in); a weight-streaming
   decode's region (re-planned whole, scheduler.placement.plan_streaming) attaches to MemoryX again, which
   is started afresh for the new region (the old one stopped) when the region moved;
6. started the loops again. The caller then resumes every unfinished request (waferrt.serving.recovery):
   the K/V entries that died are recomputed by replaying the requests' tokens.
Under the fail-fast policy the first fault raises :class:`~waferrt.faults.errors.FaultStop` instead. A
fault during the repair is raised (the host recovers from it in turn); anything else that stops the repair
(a re-plan the decode cannot run, a bug) is Unrecoverable at once, and so are more than MAX_FRUITLESS
recoveries in a row that found no new fault and brought no token: never a loop.
"""

from __future__ import annotations

import time

from waferrt.actors.tile import Tile
from waferrt.actors.watch import NodeLost, TileDied, TileFailed, TileStalled
from waferrt.core.mesh import Coord, Dir, TileId
from waferrt.fabric.links import FabricError, FabricTimeout
from waferrt.faults.errors import FaultError, FaultStop, NoRoom, PayloadCorrupt, Unrecoverable
from waferrt.faults.model import CoreFailure, FaultKind, LinkFailure, NodeLoss, Straggler, TileCrash
from waferrt.scheduler.geometry import link_inside
from waferrt.scheduler.repair import replan
from waferrt.scheduler.types import PlanError

FOUND_BY = {FaultKind.CORE: "core failed in its region", FaultKind.LINK: "link failed in its region",
            FaultKind.CORRUPT: "payload checksum", FaultKind.TILE: "tile did not answer"}
CALL_S = 30.0  # a tile that beats but has not ended, reported or set up its part by then is stuck: restarted
MAX_FRUITLESS = 3  # recoveries in a row after which no new token came: the run is not getting anywhere


def recover(dec, error: Exception) -> list:
    """Repair the wafer after `error` (module doc). Another fault during the repair raises that fault (the
    host recovers from it in turn); anything else that stops the repair -- a re-plan the decode cannot run,
    a bug -- is :class:`Unrecoverable`, naming it and the fault it was recovering from."""
    try:
        return _recover(dec, error)
    except (FaultError, TileFailed, FabricError):
        raise
    except Exception as e:  # noqa: BLE001 - not a fault: retrying would fail the same way
        raise Unrecoverable(f"the recovery from {error} failed: {type(e).__name__}: {e}") from e


def _recover(dec, error: Exception) -> list:
    llm, wafer, session = dec.llm, dec.wafer, dec.session
    found = time.time()
    if session.policy == "fail-fast":
        raise FaultStop(f"the fail-fast policy ends the run at the first fault: {error}") from error
    dec.fruitless += 1
    if dec.fruitless > MAX_FRUITLESS:
        raise Unrecoverable(f"{MAX_FRUITLESS} recoveries in a row found no new fault and produced no token; the "
                            f"last failure: {error}")
    wafer.failed = None
    dead = wafer.dead_tiles()
    _read_reports(wafer, session, llm.placement)
    live = [t for t in wafer.tiles if t not in dead]
    wafer.watch.track({t: wafer.tiles[t] for t in live})
    runs = [r for rs in wafer.call([(t, Tile.decode_abort, ()) for t in live], within=CALL_S) for r in rs]
    reports = wafer.call([(t, Tile.dead, ()) for t in live], within=CALL_S)
    for r in reports:
        for rec in r["fired"]:
            assess(session, session.on_message(rec), llm.placement)
    hit = [e for e in session.log.pending() if not isinstance(e.fault, Straggler)]  # stragglers need nothing
    cores = {c for r in reports for c in r["cores"]}
    links = {tuple(link) for r in reports for link in r["links"]}
    hit += _unplanned(session, dead, hit, found) + _unexplained(session, llm.placement, cores, links, found)
    if {e.index for e in hit} - dec.handled:  # a new fault to recover from: progress, whatever comes next
        dec.fruitless = 0
        dec.handled |= {e.index for e in hit}
    by, kind = _detector(error)
    for e in hit:  # a fault of another kind than the error's was found by the recovery's own scan
        session.log.mark_detected([e], by if e.kind is kind or len(hit) == 1 else
                             f"{FOUND_BY.get(e.kind, by)} (scan after a fault)", found)
    moved = _replan(llm, cores, links, dead)
    _restart(wafer, session, dead, llm)
    shipped = _set_up(llm, wafer)
    dec.start()
    modelled = shipped / llm.placement.spec.ingress_bytes_per_s
    what = "; ".join(filter(None, [f"re-planned {', '.join(moved)}" if moved else "",
                                   f"restarted {', '.join(map(str, dead))}" if dead else "",
                                   f"{shipped / 1e6:.1f} MB of weights sent again" if shipped else "",
                                   "replayed the unfinished requests"]))
    session.log.mark_recovered(hit, what, time.time(), modelled)
    return runs


def _read_reports(wafer, session, placement) -> None:
    """The fault reports the host has not read yet -- a tile reports a fault as it fires, and a TileCrash's tile
    then dies, perhaps while the host was busy with another fault -- go into the log now, before anything is
    armed again on a restarted tile: a fault that fired is never armed (and fired) a second time."""
    for msg in wafer.watch.listen(0):
        if msg["k"] == "fault":
            assess(session, session.on_message(msg), placement)


def _unplanned(session, dead: list[TileId], hit: list, at: float) -> list:
    """Tiles that died with no injected fault behind them (a real crash, a kill from outside): each becomes a
    TileCrash event of the log, found when the recovery found it."""
    if any(isinstance(e.fault, NodeLoss) for e in hit):
        return []
    explained = {e.fault.tile for e in hit if isinstance(e.fault, TileCrash)}
    return session.log.found([TileCrash(t) for t in dead if t not in explained], at)


def _unexplained(session, placement, cores: set, links: set, at: float) -> list:
    """Dead cores and links inside the decode's regions that no fault of this session explains (they died
    in an earlier run, e.g. one that a fail-fast policy ended): each becomes an event of the log, found when
    the recovery found it."""
    regions = [r for _, r in placement.regions()]
    cores = {c for c in cores if any(r.contains(c) for r in regions)}
    links = {link for link in links if any(link_inside(r, *link) for r in regions)}
    known = {e.fault.core for e in session.log.events if isinstance(e.fault, CoreFailure)}
    known |= {frozenset((e.fault.a, e.fault.b)) for e in session.log.events if isinstance(e.fault, LinkFailure)}
    new = [CoreFailure(c) for c in sorted(cores) if c not in known]
    new += [LinkFailure(a, b) for a, b in sorted(links) if frozenset((a, b)) not in known]
    return session.log.found(new, at)


def assess(session, event, placement) -> None:
    """A fault that fired on a core or link that no region of the decode uses, or a straggler on a tile that
    runs no region of it, is found at once (the tile's own scan) and needs nothing: the core stays dead and
    later re-plans avoid it; the straggler has nothing to slow."""
    if event is None or event.detected_at is not None:
        return
    f, regions = event.fault, [r for _, r in placement.regions()]
    dead = "no region of the decode uses it (it stays dead)"
    if isinstance(f, CoreFailure):
        idle, why = not any(r.contains(f.core) for r in regions), dead
    elif isinstance(f, LinkFailure):
        idle, why = not any(link_inside(r, f.a, f.b) for r in regions), dead
    elif isinstance(f, Straggler) and f.core is not None:
        idle, why = not any(r.contains(f.core) for r in regions), "no region of the decode holds it (nothing to slow)"
    elif isinstance(f, Straggler):
        busy = {t for r in regions for t in placement.mesh.tiles_of(r)}
        idle, why = f.tile not in busy, "the tile runs no region of the decode (nothing to slow)"
    else:
        return
    if idle:
        now = time.time()
        session.log.mark_detected([event], "the tile's own scan", now)
        session.log.mark_recovered([event], f"none needed: {why}", now)


def _detector(error: Exception) -> tuple[str, FaultKind | None]:
    """What found the fault (from the error that ended the attempt), and the kind of fault it points to."""
    text = str(error)
    if isinstance(error, NodeLost):
        return "the host (it removed the node)", FaultKind.NODE
    if isinstance(error, TileDied):
        return "Ray: actor died", FaultKind.TILE
    if isinstance(error, TileStalled):
        return "heartbeat silent", FaultKind.TILE
    if isinstance(error, PayloadCorrupt) or "PayloadCorrupt" in text:
        return FOUND_BY[FaultKind.CORRUPT], FaultKind.CORRUPT
    for kind, name in ((FaultKind.CORE, "CoreFailed"), (FaultKind.LINK, "LinkFailed")):
        if name in text:
            return FOUND_BY[kind], kind
    if isinstance(error, FabricTimeout) or "FabricTimeout" in text:
        return "deadline (pace)", None
    return (type(error).__name__ if not isinstance(error, TileFailed) else "tile failed"), None


def _replan(llm, cores: set[Coord], links: set[tuple[Coord, Coord]], dead_tiles: list[TileId]) -> tuple[str, ...]:
    """A placement that avoids every dead core and link; the regions that moved."""
    p = llm.placement
    new_cores = frozenset(cores) - p.mesh.dead
    new_links = frozenset(links) - p.dead_links
    if not (new_cores or new_links):
        return ()
    try:
        rp = replan(p, new_cores, new_links)
    except PlanError as e:
        lost = [*(f"core {c}" for c in sorted(new_cores)), *(f"link {a}-{b}" for a, b in sorted(new_links))]
        died = ", ".join(lost[:6]) + (f" and {len(lost) - 6} more" if len(lost) > 6 else "")
        if p.streaming:  # the planner's message says what a streaming region would take
            raise NoRoom(f"{died} died and the weight-streaming decode no longer fits the wafer around them: "
                         f"{e}") from None
        raise NoRoom(f"{died} died and the model no longer fits the wafer around them: {e}. It would "
                            "need more spare cores (a bigger mesh, or fewer K/V tokens per request)") from None
    llm.adopt(rp.placement)
    return rp.moved


def _restart(wafer, session, dead: list[TileId], llm) -> None:
    """New actors for the dead tiles, on their node unless it was lost (then next to a live neighbour's, or
    the driver's); the faults that had not fired there are armed again."""
    if not dead:
        return
    from waferrt.actors.remote import alive_nodes

    alive = alive_nodes() - wafer.lost  # Ray may not know yet that a node the host removed is gone
    nodes = {}
    for t in dead:
        node = wafer.nodes.get(t)
        if node not in alive:
            near = [wafer.nodes[n] for d in Dir if (n := wafer.mesh.tile_neighbour(t, d)) is not None
                    and n not in dead and wafer.nodes.get(n) in alive]
            node = near[0] if near else wafer.driver_node()
        nodes[t] = node
    try:
        wafer.restart(dead, nodes)
    except Exception as e:  # noqa: BLE001 - whatever Ray says, the run cannot go on without these tiles
        raise Unrecoverable(f"{', '.join(map(str, dead))} died and could not be started again: {e}") from None
    session.rearm(dead)


def _set_up(llm, wafer) -> int:
    """Every tile sets the (re-planned) decode up again; the stages that moved or lost their tile get their
    weights from the host. Returns the bytes sent."""
    need = wafer.call([(t, Tile.decode_setup, (llm.setup,)) for t in wafer.tiles], within=CALL_S)
    stages = sorted({s for ss in need for s in ss})
    return llm.load(llm.weights, stages=stages) if stages else 0
