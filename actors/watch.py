"""Waiting on tile actors with a deadline on every wait, and telling a dead tile from a frozen one.

Contract: a :class:`Watch` holds the tile actors and the host inbox they beat to (waferrt.actors.stream).
``gather(refs, tiles)`` waits for Ray calls in short slices; between slices it takes the inbox's messages and checks
that every tile has beaten within ``stall_s`` seconds; when a tile says a neighbour's link dropped, it looks at once
at the processes of the tiles on this machine and pings those on other nodes (a dead actor's ping comes back as
Ray's actor-death error). A call whose actor died raises :class:`TileDied` at once, naming that tile; a tile that
falls silent is asked for its pid: no answer and Ray says its process is gone -> :class:`TileDied`; no answer from a
tile on this machine whose process is running and using the CPU -> busy in a long call (its heartbeat thread starved
on a loaded machine: a real-size layer's weights cut), not stalled; no answer otherwise (SIGSTOP, a hung process) ->
:class:`TileStalled`. ``local(tiles)`` learns which tiles run on this machine as this user (any Ray node).
``listen(timeout)`` returns the inbox's messages other than beats (events, errors), ``check()`` runs the liveness
check alone, ``sweep()`` pings every tile and returns those that do not answer (after a fault); ``track`` /
``reset`` follow restarted tiles; ``slow()`` names the tiles whose pace (carried by their beats) is far behind the
others' or their own fastest. The errors are :class:`TileFailed` s; they name the tile and say what to do
(:class:`NodeLost`, a TileDied, is the Wafer's when the host removed the tile's node)."""

from __future__ import annotations

import math
import os
import socket
import time

import psutil
import ray

from waferrt.core.mesh import TileId
from waferrt.fabric.misuse import TileHung

WAIT_S = 0.25  # one slice of waiting on Ray calls, between liveness checks
PING_S = 2.0  # how long a silent tile has to answer a ping
BUSY_CPU_S = 0.05  # CPU seconds a silent tile on this machine must use while pinged to count as busy, not frozen
SLOW_FACTOR, SLOW_MARGIN_S = 3.0, 3e-3  # a straggler: this many times the median pace, and this much more


class TileFailed(RuntimeError):
    """A tile stopped working; ``tile`` names it."""

    def __init__(self, tile: TileId | str, what: str):
        self.tile = tile
        super().__init__(f"{tile} {what}")

    def __reduce__(self):
        return type(self), (self.tile, str(self).split(" ", 1)[1])


class TileDied(TileFailed):
    """The tile's process is gone (killed, crashed, its node lost)."""


class NodeLost(TileDied):
    """The tile's Ray node is gone (a NodeLoss the host carried out), and the tile with it."""


class TileStalled(TileFailed):
    """The tile's process is alive but has said nothing for longer than the deadline (frozen, hung)."""


class Watch:
    def __init__(self, handles: dict[TileId, object], inbox, stall_s: float):
        self.handles, self.inbox, self.stall_s = handles, inbox, stall_s
        now = time.monotonic()
        self.seen = {str(t): now for t in handles}  # tile -> when it last said something
        self.names = {str(t): t for t in handles}
        self.backlog: list[dict] = []  # messages that came while waiting on calls, for the next listen
        self.paces: dict[str, float] = {}  # tile -> its latest pace (seconds per stage run, lately)
        self.base: dict[str, float] = {}  # tile -> its fastest pace so far (its own yardstick)
        self.suspect = False  # a tile said a neighbour's link dropped: look at their processes at the next check
        self.pids: dict[TileId, int] = {}  # the processes of the tiles on this machine (``local``)
        self.pings: dict[object, tuple[TileId, object]] = {}  # ping ref -> (tile, the handle pinged): other nodes'

    def track(self, handles: dict[TileId, object]) -> None:
        """Watch these tiles (new or restarted) from now on, and only the tiles of `handles`."""
        now = time.monotonic()
        self.handles = dict(handles)
        self.seen = {str(t): self.seen.get(str(t), now) for t in handles}
        self.names = {str(t): t for t in handles}

    def local(self, tiles: list[TileId]) -> frozenset[TileId]:
        """Those of `tiles` that run on this machine as this user -- on any Ray node: several may share a
        machine -- whose processes this host can look at (and whose files its tiles can map): learn their
        processes, whose end the next check notices at once when a neighbour's link to them drops."""
        refs = {self.handles[t].whereabouts.remote(): t for t in tiles}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=PING_S * 5)
        here = (machine_id(), os.getuid())
        for ref in ready:
            machine, uid, pid = ray.get(ref)
            if (machine, uid) == here:
                self.pids[refs[ref]] = pid
        return frozenset(t for t in tiles if t in self.pids)

    def reset(self, tiles: list[TileId]) -> None:
        """These tiles start afresh (restarted): their silence counts from now, their pace is not known yet."""
        for t in tiles:
            self.seen[str(t)] = time.monotonic()
            self.paces.pop(str(t), None)
            self.base.pop(str(t), None)
            self.pids.pop(t, None)  # its process (``local`` learns the new one if it runs on this machine)

    def listen(self, timeout: float) -> list[dict]:
        """The inbox's messages that arrived within `timeout`, but the beats (which only mark the tile alive)."""
        out, self.backlog = self.backlog, []
        for msg in self.inbox.get(0 if out else timeout):
            if msg["tile"] in self.seen:
                self.seen[msg["tile"]] = time.monotonic()
            if msg["k"] == "lost":
                self.suspect = True
            elif msg["k"] != "beat":
                out.append(msg)
            elif msg.get("pace"):
                self._pace(msg["tile"], msg["pace"])
        return out

    def keep_for_later(self) -> None:
        """Take what arrived while the host waits on calls into the backlog, which the next ``listen`` returns
        first (``listen`` hands the backlog back with what is new: each message once)."""
        self.backlog = self.listen(0)

    def note_paces(self, paces: dict[TileId, float | None]) -> None:
        """Paces asked of the tiles directly (the last look at the end of a decode, before a beat carried them)."""
        for t, p in paces.items():
            if p and str(t) in self.names:
                self._pace(str(t), p)

    def _pace(self, tile: str, pace: float) -> None:
        self.paces[tile] = pace
        self.base[tile] = min(self.base.get(tile, pace), pace)

    def slow(self, factor: float = SLOW_FACTOR, margin: float = SLOW_MARGIN_S) -> list[TileId]:
        """The tiles whose pace is `factor` times, and `margin` seconds per stage more than, the median tile's
        or their own fastest so far (several tiles may slow at once): stragglers (slow, not dead: nothing is
        done to them)."""
        paces = sorted(self.paces.values())
        median = paces[len(paces) // 2 - (len(paces) % 2 == 0)] if len(paces) > 1 else None  # the lower one

        def behind(p: float, ref: float | None) -> bool:
            return ref is not None and p > factor * ref and p - ref > margin

        return [self.names[t] for t, p in self.paces.items()
                if t in self.names and (behind(p, median) or behind(p, self.base.get(t)))]

    def sweep(self) -> list[TileId]:
        """The tiles that do not answer a ping within PING_S (dead, or frozen: as good as dead)."""
        pings = {self.handles[t].pid.remote(): t for t in self.handles}
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=PING_S)
        alive = set()
        for ref in ready:
            try:
                ray.get(ref)
                alive.add(pings[ref])
            except ray.exceptions.RayActorError:
                pass
        return [t for t in self.handles if t not in alive]

    def check(self) -> None:
        """Raise TileDied / TileStalled for the first tile that has been silent for longer than stall_s, or
        that is gone after a neighbour lost its link to it: a tile on this machine by its process, one on
        another node by a ping that Ray answers with the actor's death (looked at again at every check, never
        waited for: a busy tile answers later)."""
        if self.suspect:
            self.suspect = False
            for t, pid in self.pids.items():
                if t in self.handles and not _running(pid):
                    raise TileDied(t, f"died: its process {pid} is gone (its neighbours lost their link to it). "
                                      "Close the wafer and open it again")
            self.pings = {r: (t, h) for r, (t, h) in self.pings.items() if self.handles.get(t) is h}  # not restarted
            pinged = {t for t, _ in self.pings.values()}
            self.pings |= {h.pid.remote(): (t, h) for t, h in self.handles.items()
                           if t not in self.pids and t not in pinged}
        if self.pings:
            self._pinged()
        now = time.monotonic()
        for name, last in self.seen.items():
            if now - last > self.stall_s:
                self._diagnose(self.names[name], now - last)

    def _pinged(self) -> None:
        """The pings sent to other nodes' tiles that have come back: a dead actor's raises TileDied."""
        ready, _ = ray.wait(list(self.pings), num_returns=len(self.pings), timeout=0)
        for ref in ready:
            tile, handle = self.pings.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                if self.handles.get(tile) is handle:  # not a tile restarted since
                    raise died(tile, e) from None

    def _diagnose(self, tile: TileId, silent: float) -> None:
        pid = self.pids.get(tile)
        cpu = _cpu_seconds(pid) if pid is not None else None
        ping = self.handles[tile].pid.remote()
        ready, _ = ray.wait([ping], timeout=PING_S)
        if ready:
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                raise died(tile, e) from None
            self.seen[str(tile)] = time.monotonic()  # it answered: slow, not silent
            return
        if cpu is not None and _working(pid, cpu):  # busy in a long call (a real-size layer's weights cut on a
            self.seen[str(tile)] = time.monotonic()  # loaded machine): its heartbeat thread starved, not frozen
            return
        raise TileStalled(tile, f"has sent no heartbeat for {silent:.1f}s and does not answer (frozen or "
                                "hung: SIGSTOP, a debugger, swapping); its neighbours wait for it. Close the "
                                "wafer and open it again")

    def gather(self, refs: list, tiles: list[TileId], progress=None, within: float | None = None,
               names: list[str] | None = None, settle: float | None = None) -> tuple[list, dict[int, BaseException]]:
        """Wait for every call, checking liveness between slices: (results, {index: the call's error});
        ``progress(done, total)`` after every call that ends. A call still running after `within` seconds
        (its tile beats, but its actor is stuck, e.g. in an earlier call) raises TileStalled naming it. Once a
        call failed, the others have `settle` seconds to end: one still running then is stuck in a kernel's own
        code, its error a :class:`~waferrt.fabric.misuse.TileHung` (its actor cannot run anything more)."""
        results, errors, done = [None] * len(refs), {}, 0
        end = time.monotonic() + within if within else None
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=WAIT_S)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    raise died(tiles[i], e) from None
                except Exception as e:  # noqa: BLE001 - the tile's own error, returned to the caller
                    errors[i] = _cause(e)
                    if settle is not None:
                        end = min(end or math.inf, time.monotonic() + settle)
                        within = None  # what ends the wait now is the settling
                done += 1
                if progress:
                    progress(done, len(refs))
            if pending:
                self.keep_for_later()
                self.check()
            if pending and end is not None and time.monotonic() > end:
                if within is None:
                    return results, {**errors, **{index[r]: _hung(tiles[index[r]], settle) for r in pending}}
                i = index[pending[0]]
                what = names[i] if names else "its call"
                raise TileStalled(tiles[i], f"is alive (it beats) but did not finish {what} within {within:g} s: its "
                                            "actor is stuck (in an earlier call, or this one)")
        return results, errors


def _hung(tile: TileId, settle: float) -> TileHung:
    e = TileHung(f"{tile} did not finish its command within {settle:g} s after another tile's failed: it is stuck "
                 "in the kernel's own code (a loop or a wait that never ends) or never reaches the primitive its "
                 "neighbours waited at; its actor is busy for good: close the wafer and open a new one")
    e.tile = e.blame = tile
    return e


def machine_id() -> str:
    """This machine, for this boot: the kernel's boot id (the host name where there is none)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def _cpu_seconds(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return None
    return t.user + t.system


def _working(pid: int, before: float) -> bool:
    """The process is running (not stopped, not a zombie) and used the CPU since it had used `before` seconds:
    a tile computing in a long call, whose heartbeat thread waits for the CPU or the GIL (a frozen process --
    SIGSTOP, a deadlock -- uses none)."""
    try:
        p = psutil.Process(pid)
        running = p.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE,
                                     psutil.STATUS_DEAD)
        now = _cpu_seconds(pid)
    except psutil.NoSuchProcess:
        return False
    return running and now is not None and now - before >= BUSY_CPU_S


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def died(tile: TileId, e: BaseException) -> TileDied:
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return TileDied(tile, f"died: its Ray actor is gone ({why[:200]}). Close the wafer and open it again")


def _cause(e: BaseException) -> BaseException:
    """A tile's own exception (e.g. SramOverflow) rather than Ray's wrapper, when Ray kept it."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e
