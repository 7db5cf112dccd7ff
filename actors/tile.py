"""A tile: the cores of one rectangle of the mesh, their SRAM, their DSM blocks, and its fabric links.

Contract: :class:`Tile` is a plain class (unit tests construct it directly; ``waferrt.actors.remote``
makes it a Ray actor). It owns the SRAM book of its cores and the local blocks of every DSM tensor
that touches it, and runs SPMD kernels over the part of a region it holds, exchanging with neighbour
tiles only through its links. Once connected it beats to the host's inbox (waferrt.actors.stream), so a
frozen or dead tile is noticed within seconds. For LLM decode it books its stages' SRAM
(``decode_setup``), takes their weights (``decode_load``) and runs the decode loop in a thread of its
own (``decode_start`` / ``decode_submit`` / ``decode_stop``): no Ray call per token. Faults
(waferrt.faults) are armed on it with ``inject``; one that fires is reported to the host at once, a
TileCrash ends the process with ``os._exit``; ``dead()`` says what died here; after a fault the host
ends the loop with ``decode_abort``, re-plans, sets the decode up again (``decode_setup`` keeps what did
not move) and, for a restarted neighbour, ``rewire`` s the link. Its methods are what
the runtime calls (``Wafer.call(tile, Tile.method, args)``) and return plain data.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from waferrt.core.layout import Layout, core_bytes
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Coord, Dir, MeshSpec, Region, TileId
from waferrt.core.spec import HardwareSpec
from waferrt.core.sram import SramBook
from waferrt.decode.program import TileProgram
from waferrt.decode.schedule import StageRun
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.fabric.comm import Span
from waferrt.fabric.kernel import Context
from waferrt.fabric.spmd import run_kernel
from waferrt.fabric.traced import kernel_parts
from waferrt.faults.errors import CoreFailed
from waferrt.faults.faultmap import FaultMap, lost_blocks
from waferrt.faults.model import fault_dict
from waferrt.faults.state import FaultState, Fired

CRASH_GRACE_S = 0.2  # a crashing tile's last report gets this long to leave before the process dies


class Tile:
    def __init__(self, mesh: MeshSpec, spec: HardwareSpec, tile: TileId, timeout: float = 30.0):
        self.mesh, self.spec, self.tile, self.timeout = mesh, spec, tile, timeout
        self.region = mesh.tile_region(tile)
        self.sram = SramBook(self.region, spec.sram_bytes)
        self.store: dict[str, tuple[Layout, np.ndarray]] = {}
        self.links = None
        self.heartbeat = None  # beats to the host once watched
        self.decoder: TileProgram | None = None
        self.loop = None  # the decode loop's thread while it runs
        self.booked: list[str] = []  # the decode's SRAM bookings
        self.faults = FaultState(tile, self.region, self._report, self._crash)
        self.host: str | None = None
        self._outboxes = threading.local()  # one socket to the host per thread that reports
        self.tracer = None  # a waferrt.core.trace.Recorder between trace_start and trace_stop

    # -- fabric -----------------------------------------------------------------------------------------
    def bind(self, ipc_dir: str, tcp: bool = False) -> dict:
        """Open this tile's receive socket (tcp too when a neighbour tile is on another node); its addresses
        and the tile's public key."""
        from .fabric import ZmqLinks

        self.links = ZmqLinks(self.tile, self.timeout)
        return self.links.bind(ipc_dir, tcp)

    def address(self) -> dict:
        """Where this tile listens and its public key (what bind returned)."""
        return {**self.links.endpoints, "key": self.links.public}

    def admit(self, keys: dict[str, bytes]) -> None:
        """The neighbour tiles' public keys, by side: only they may talk to this tile."""
        self.links.admit({Dir[d]: k for d, k in keys.items()})

    def connect(self, peers: dict[str, str], host: str) -> None:
        """Link to the neighbour tiles' sockets and start beating to the host's inbox (`host`)."""
        from .stream import Heartbeat

        self.links.connect({Dir[d]: a for d, a in peers.items()})
        self.links.corrupt = self.faults.on_send
        self.links.gate.on_disconnect = lambda: self._tell("lost")  # a neighbour's link dropped: is it dead?
        self.host = host
        self.heartbeat = Heartbeat(host, str(self.tile), self.pace)

    def rewire(self, d: str, key: bytes, address: str) -> None:
        """The neighbour to the `d` side was restarted: admit its new key, link to its new socket, and number
        that link's messages from the start again."""
        self.links.rewire(Dir[d], key, address)

    # -- faults -----------------------------------------------------------------------------------------
    def inject(self, fault, index: int, seed: int = 0) -> None:
        """Arm a fault of waferrt.faults.model on this tile (it fires when its trigger holds)."""
        self.faults.arm(fault, index, seed)
        self.faults.tick(None)

    def disarm(self) -> None:
        self.faults.disarm()

    def dead(self) -> dict:
        """What has died on this tile: its dead cores (and the DSM blocks each lost) and links, and every fault
        that fired here."""
        f = self.faults
        layouts = {name: layout for name, (layout, _) in self.store.items()}
        return {"cores": sorted(f.dead_cores), "links": sorted(tuple(sorted(link)) for link in f.dead_links),
                "lost": [(c, lost_blocks(layouts, c)) for c in sorted(f.dead_cores)],
                "fired": [_fired(r) for r in f.fired]}

    def kernel_faults(self, epoch: int) -> dict:
        """A kernel command `epoch` is about to start here: the faults due fire (a Trigger's step counts the
        kernel commands this tile runs); what is dead here (``dead()``), for the command's fault map."""
        self.faults.tick(epoch)
        return self.dead()

    def _report(self, rec: Fired) -> None:
        """A fault fired here: tell the host at once."""
        self._tell("fault", **_fired(rec))

    def _tell(self, kind: str, **fields) -> None:
        """A message to the host's inbox, from whichever thread this runs in (one socket per thread)."""
        if self.host is None:
            return
        from .stream import Outbox

        out = getattr(self._outboxes, "out", None)
        if out is None:
            out = self._outboxes.out = Outbox(self.host, str(self.tile))
        out.send(kind, **fields)

    def _crash(self) -> None:
        """A TileCrash fired: the process dies as a real crash would (no cleanup, no goodbye)."""
        time.sleep(CRASH_GRACE_S)  # the report of the crash leaves first
        os._exit(1)

    # -- DSM --------------------------------------------------------------------------------------------
    def _local(self, layout: Layout) -> tuple[Region, tuple[slice, slice]]:
        """This tile's part of the tensor's region, and its window into the region's (rows, cols)."""
        local = layout.region.intersect(self.region)
        return local, layout.region.window(local)

    def alloc(self, name: str, layout: Layout) -> None:
        local, window = self._local(layout)
        self.sram.reserve(name, local, core_bytes(layout)[window])
        self.store[name] = (layout, np.zeros(local.shape + layout.max_block_shape(), layout.dtype))

    def free(self, name: str) -> None:
        self.sram.release(name)
        del self.store[name]

    def put(self, name: str, blocks: np.ndarray) -> None:
        layout, cur = self.store[name]
        if blocks.shape != cur.shape:
            raise ValueError(f"blocks for {name!r} on {self.tile} must be {cur.shape}, got {blocks.shape}")
        cur[...] = blocks

    def get(self, name: str, fill=None) -> np.ndarray:
        """This tile's blocks of `name`. A dead core's block is lost: CoreFailed names it, unless `fill` is
        given (its block then holds `fill`)."""
        layout, blocks = self.store[name]
        lost = self._dead_blocks(layout)
        if lost and fill is None:
            raise self._lost(name, layout, "wafer.dsm.get; get(name, fill=np.nan) reads the living blocks")
        if lost:
            blocks = blocks.copy()
            for at in lost:
                blocks[at] = fill
        return blocks

    def read(self, name: str, row: int, col: int) -> np.ndarray:
        """The block of the core at (row, col) of the tensor's region (CoreFailed if that core is dead)."""
        layout, blocks = self.store[name]
        core = Coord(layout.region.x0 + col, layout.region.y0 + row)
        if core in self.faults.dead_cores:
            raise CoreFailed(core, lost_blocks({name: layout}, core), f"{self.tile}, read by wafer.dsm.read")
        return blocks[self._block(layout, core)]

    def _block(self, layout: Layout, core) -> tuple[int, int]:
        """Where `core`'s block sits in this tile's blocks of a tensor of `layout`."""
        local = self._local(layout)[0]
        return core.y - local.y0, core.x - local.x0

    def _dead_blocks(self, layout: Layout) -> list[tuple[int, int]]:
        """Where this tile's dead cores' blocks of a tensor of `layout` sit (they are lost)."""
        local = self._local(layout)[0]
        return [self._block(layout, c) for c in sorted(self.faults.dead_cores) if local.contains(c)]

    def _lost(self, name: str, layout: Layout, by: str) -> CoreFailed:
        core = next(c for c in sorted(self.faults.dead_cores) if layout.region.contains(c))
        return CoreFailed(core, lost_blocks({name: layout}, core), f"{self.tile}, read by {by}")

    # -- kernels ----------------------------------------------------------------------------------------
    def run(self, kernel, region: Region, args: dict, epoch: int, faults: FaultMap | None = None) -> dict:
        """Run a kernel on this tile's cores of `region`; `epoch` numbers the command (the same on every
        tile), so messages left over from an earlier, failed command are recognised and dropped. `faults`:
        what is dead in the region as the command starts (the same map on every tile of the command); a
        straggling tile (or a slow core of the region) is slower by its delay. Returns the cost and what the
        kernel printed; an error leaves as KernelFailed (waferrt.fabric.spmd.run_kernel: the kernel's line, the
        tile, the output so far)."""
        self._idle()
        ledger, links, span = kernel_parts(self.spec, self.links, self.tracer, kernel, epoch)
        self._new_epoch(epoch)
        ctx = Context(Span(region, self.region, links, self.mesh.region), ledger, self.store, tag=f"k{epoch}",
                      faults=faults)
        ctx.sram_free = self.sram.free_bytes()[self.region.window(ctx.local)]
        if delay := self.faults.delay_in(region):  # a straggling tile, or a slow core in the region
            time.sleep(delay)
        with span:
            _, printed = run_kernel(ctx, kernel, args, self.tile)
        return {"cost": ledger.snapshot(), "output": printed}

    def _new_epoch(self, epoch: int) -> None:
        self.links.epoch = epoch

    def _idle(self) -> None:
        if self.loop is not None:
            raise RuntimeError(f"{self.tile} is decoding; stop the decode before running kernels on it")

    # -- LLM decode -------------------------------------------------------------------------------------
    def decode_setup(self, setup: DecodeSetup) -> list[int]:
        """Book SRAM for the decode stages this tile hosts and get ready to load them; returns the stages that
        need their weights. Set up again (after a re-plan), the stages that stay in their region keep their
        weights."""
        self._idle()
        old = self.decoder
        for name in self.booked:
            self.sram.release(name)
        self.booked = []
        self.decoder = TileProgram(setup, self.tile, self.links, old.ledger if old else Ledger(self.spec, setup.dtype),
                                   self.faults)
        if self.tracer is not None:  # set up again during a traced decode (a recovery): keep recording
            from waferrt.decode.tracing import trace_program

            trace_program(self.decoder, self.tracer)
        need = self.decoder.adopt(old) if old else [s for s in range(len(self.decoder.stages))
                                                    if self.decoder.hosts(s)]
        for s in range(len(self.decoder.stages)):
            if self.decoder.hosts(s):
                for name, (region, nbytes) in stage_sram(setup, s).items():
                    self.sram.reserve(name, region, nbytes)
                    self.booked.append(name)
        return need

    def decode_load(self, s: int, raw) -> None:
        """Stage s's float32 weights (waferrt.decode.setup.stage_weights), cut into its cores' blocks here;
        arrays sent by reference (waferrt.model.npcache.MappedArray) are mapped from their file here (the
        embedding table is read from it a block of rows at a time)."""
        from waferrt.model.npcache import resolve

        self.decoder.load(s, (raw[0], resolve(raw[1])) if isinstance(raw, tuple) else resolve(raw))

    def decode_attach(self, memoryx, head_count: int) -> None:
        """A streaming decode: the blocks come from the MemoryX actor `memoryx` (actors.memoryx.StreamClient)."""
        from .memoryx import StreamClient

        self.decoder.attach(StreamClient(memoryx, self.decoder.setup.config.n_layers, head_count))

    def decode_start(self, epoch: int, lanes: int = 2, deadline: float = 60.0) -> None:
        """Start this tile's decode loop (waferrt.serving.loop) in a thread of its own; returns at once."""
        from .decoding import LoopThread

        self._idle()
        self._new_epoch(epoch)
        self.loop = LoopThread(self.decoder, self.host, lanes, deadline, epoch)

    def decode_submit(self, subs: list) -> None:
        """Hand requests (waferrt.serving.Submission) to the decode loop of the head's tile."""
        self.loop.submit(subs)

    def decode_cancel(self, index: int) -> None:
        self.loop.cancel(index)

    def decode_runs(self, since: int) -> list[StageRun]:
        """The stage runs the running decode loop booked from the `since`-th on (it goes on running: a server's
        modelled times while it serves)."""
        return list(self.loop.program.records[since:]) if self.loop is not None else []

    def decode_stop(self) -> list[StageRun]:
        """End the decode loop: the stage runs it booked."""
        loop, self.loop = self.loop, None
        return loop.stop() if loop is not None else []

    def decode_abort(self) -> list[StageRun]:
        """End the decode loop after a fault elsewhere (its own error, if any, is already reported): the stage
        runs it booked."""
        loop, self.loop = self.loop, None
        return loop.abort() if loop is not None else []

    def decode_swaps(self) -> int:
        """Swaps of experts NI-Balancer finished in this tile's MoE layers (waferrt.decode.moe)."""
        return self.decoder.expert_swaps() if self.decoder is not None else 0

    def decode_bytes(self) -> int:
        """Bytes of the decode's weight blocks and K/V caches that this tile holds."""
        return self.decoder.held_bytes() if self.decoder is not None else 0

    def trace_start(self) -> None:
        """Record this tile's spans from now on: its decode loop's, and the kernels it runs (waferrt.core.trace)."""
        from waferrt.core.trace import Recorder
        from waferrt.decode.tracing import trace_program

        self.tracer = Recorder(str(self.tile))
        if self.decoder is not None:
            trace_program(self.decoder, self.tracer)

    def trace_stop(self) -> list:
        """Stop recording; the spans and instants recorded since trace_start."""
        from waferrt.decode.tracing import untrace_program

        rec, self.tracer = self.tracer, None
        if rec is not None and self.decoder is not None:
            untrace_program(self.decoder)
        return rec.take() if rec is not None else []

    def names(self) -> list[str]:
        return sorted(self.store)

    def fabric_stats(self) -> dict:
        """Who tried to talk to this tile and what its fabric dropped (``ZmqLinks.stats``)."""
        return self.links.stats() if self.links is not None else {"tile": str(self.tile)}

    def sram_stats(self) -> dict:
        return {"tile": str(self.tile), **self.sram.stats()}

    def pace(self) -> float | None:
        """Wall seconds per stage run lately (what the beats carry; None before a decode ran here)."""
        return self.decoder.pace if self.decoder else None

    def pid(self) -> int:
        import os

        return os.getpid()

    def whereabouts(self) -> tuple[str, int, int]:
        """(this machine's id, the user id, the process id): a host on the same machine as the same user maps
        its weight files itself and watches this process (actors.watch.Watch.local)."""
        import os

        from .watch import machine_id

        return machine_id(), os.getuid(), os.getpid()

    def close(self) -> None:
        out = getattr(self._outboxes, "out", None)
        if out is not None:
            out.close()
        if self.loop is not None:
            self.loop.stop_flag.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.links is not None:
            self.links.close()
        self.links = self.heartbeat = None


def _fired(rec: Fired) -> dict:
    return {"index": rec.index, "fault": fault_dict(rec.fault), "step": rec.step, "at": rec.at, "tile": str(rec.tile)}
