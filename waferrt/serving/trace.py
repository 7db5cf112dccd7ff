"""The trace of one decode: the host's track, every tile's track, and the modelled wafer's schedule.

Contract: :class:`DecodeTrace` is made by ``serve`` when a trace is asked for (``generate(...,
trace=path)``): its ``host`` recorder takes the host's spans (``start`` of the tiles' loops, ``submit``,
``stop``, the whole ``decode``) and an instant per token that arrives; ``add_tiles`` takes what each tile
recorded (waferrt.decode.tracing: compute per stage run, micro-batch visits, sends, waits on a
neighbour -- written with an arrow per message, from its send to the wait that took it); ``instant(name,
tile, **args)`` puts an instant on a tile's track (or the host's) -- faults and recoveries as they are
detected; ``faults(events)`` puts a decode's faults on the tracks when they
fired, were found and were recovered from; ``finish(runs)`` adds the stage runs, from which the modelled
timeline is scheduled (waferrt.decode.schedule.flow_schedule: when every token ran at every stage
region on the modelled wafer). ``write(path)`` writes Chrome / Perfetto trace-event JSON with two
processes: "wafer (emulator wall clock)" -- host first, then one track per tile, all on the machine's
wall clock (waferrt.core.trace says how far tracks on several machines line up) -- and "modelled wafer",
one track per stage region, in the modelled time (every request at its own pace). ``busy_s()`` is each
tile's time in compute spans, ``sent_bytes()`` what each tile sent over each of its links (the heatmap
reads both).
"""

from __future__ import annotations

import time
from pathlib import Path

from waferrt.core.mesh import Region
from waferrt.core.trace import Instant, Process, Recorder, Span, wall_process, write_trace
from waferrt.decode.schedule import StageRun, flow_schedule
from waferrt.decode.setup import DecodeSetup
from waferrt.decode.stage import StageKind
from waferrt.faults.model import fault_tiles

HOST = "host"


class DecodeTrace:
    def __init__(self, setup: DecodeSetup, clock_hz: float):
        self.setup, self.clock_hz = setup, clock_hz
        self.origin_ns = time.time_ns()
        self.host = Recorder(HOST)
        self.tiles: dict[str, list] = {str(t): [] for t in setup.mesh.tiles()}  # every tile has a track
        self.runs: list[StageRun] = []

    def instant(self, name: str, tile: str | None = None, cat: str = "fault", **args) -> None:
        """An instant on `tile`'s track (a tile's name, e.g. "tile(1,0)"; None: the host's), now."""
        if tile is None:
            self.host.instant(name, cat, **args)
        else:
            self.tiles.setdefault(tile, []).append(Instant(name, cat, time.time_ns(), tuple(args.items())))

    def faults(self, events: list) -> None:
        """Every fault of the decode (waferrt.faults.events.FaultEvent) as instants at the times they happened:
        its firing on the track of the tile that carries it, its detection and recovery on the host's."""
        for e in events:
            tiles = fault_tiles(e.fault, self.setup.mesh)
            what = (("fault", e.kind.value), ("where", e.where), ("step", e.step))
            for name, at, track, more in ((f"{e.kind} fault fired", e.fired_at, str(tiles[0]) if tiles else None, ()),
                                          ("fault detected", e.detected_at, None, (("by", e.detected_by),)),
                                          ("recovered", e.recovered_at, None, (("action", e.action),))):
                if at is not None:
                    ev = Instant(name, "fault", round(at * 1e9), what + more)
                    (self.host.events if track is None else self.tiles.setdefault(track, [])).append(ev)

    def add_tiles(self, events: dict[str, list]) -> None:
        for tile, evs in events.items():
            self.tiles.setdefault(tile, []).extend(evs)

    def finish(self, runs: list[StageRun]) -> None:
        self.runs = list(runs)

    # -- what it shows -----------------------------------------------------------------------------------
    def processes(self) -> list[Process]:
        wall = wall_process(self.host, self.tiles, self.origin_ns)
        return [wall, self._modelled()] if self.runs else [wall]

    def _modelled(self) -> Process:
        stages = self.setup.stages()
        names: dict[Region, str] = {}
        for st in stages:
            names.setdefault(st.region, f"{st.name if st.kind is StageKind.LAYER else 'embed + head'} {st.region}")
        tracks: dict[str, list] = {name: [] for name in names.values()}
        for (req, pos, s), (region, a, b) in flow_schedule(self.runs, len(stages) - 1, self.clock_hz).items():
            tracks[names[region]].append(Span(stages[s].name, "modelled", round(a * 1e9), round(b * 1e9),
                                              (("request", req), ("pos", pos))))
        return Process(f"modelled wafer (at {self.clock_hz / 1e9:.2f} GHz; every request at its own pace)",
                       tuple((n, tuple(sorted(evs, key=lambda e: e.start_ns))) for n, evs in tracks.items()),
                       exact=False)

    def write(self, path: str | Path) -> Path:
        meta = {"mesh": str(self.setup.mesh), "stages": len(self.setup.stages()),
                "clock": "time.time_ns() of each tile's machine; modelled process: modelled seconds"}
        return write_trace(path, self.processes(), meta)

    def busy_s(self) -> dict[str, float]:
        """Seconds each tile spent in compute spans (its stage runs)."""
        return {t: sum(e.end_ns - e.start_ns for e in evs if isinstance(e, Span) and e.cat == "compute") / 1e9
                for t, evs in self.tiles.items()}

    def wall_s(self) -> float:
        """From the first to the last event of the decode, in seconds."""
        times = [t for evs in (self.host.events, *self.tiles.values()) for e in evs
                 for t in ((e.start_ns, e.end_ns) if isinstance(e, Span) else (e.at_ns,))]
        return (max(times) - min(times)) / 1e9 if times else 0.0

    def sent_bytes(self) -> dict[tuple[str, str], int]:
        """(tile, link direction) -> bytes the tile sent over that link."""
        out: dict[tuple[str, str], int] = {}
        for t, evs in self.tiles.items():
            for e in evs:
                if isinstance(e, Span) and e.cat == "send":
                    a = dict(e.args)
                    out[(t, a["link"])] = out.get((t, a["link"]), 0) + a["bytes"]
        return out
