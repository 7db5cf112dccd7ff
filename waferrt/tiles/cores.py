"""A tile's cores: their SRAM, their DSM blocks, the kernels and decode stages they run, and their faults.

Contract: :class:`TileCores` is a plain class, Ray-free (unit tests and waferrt.localtiles construct it;
waferrt.actors.tile.Tile extends it with what needs a process and sockets). It owns the SRAM book of its
cores and the local blocks of every DSM tensor that touches it, and runs SPMD kernels over the part of a
region it holds, exchanging with neighbour tiles only through ``links`` (any waferrt.fabric.links.Links,
set by whoever runs it). For LLM decode it books its stages' SRAM (``decode_setup``: set up again after
a re-plan, it keeps what did not move) and takes their weights (``decode_load``); its TileProgram is
``decoder``. Faults (waferrt.faults) are armed on it with ``inject`` and fire when their trigger holds;
``dead()`` says what died here (the hooks that report a fault or end a process are the actor's). While a
decode loop runs its program (``loop``, set by the actor layer), it refuses kernels and a new set-up. Its
methods are what the runtime calls (``Wafer.call(tile, Tile.method, args)``) and return plain data.
"""

from __future__ import annotations

import time

import numpy as np

from waferrt.core.layout import Layout, core_bytes
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Coord, MeshSpec, Region, TileId
from waferrt.core.spec import HardwareSpec
from waferrt.core.sram import SramBook
from waferrt.decode.program import TileProgram
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.fabric.comm import Span
from waferrt.fabric.kernel import Context
from waferrt.fabric.spmd import run_kernel
from waferrt.fabric.traced import kernel_parts
from waferrt.faults.errors import CoreFailed
from waferrt.faults.faultmap import FaultMap, lost_blocks
from waferrt.faults.model import fault_dict
from waferrt.faults.state import FaultState, Fired


class TileCores:
    def __init__(self, mesh: MeshSpec, spec: HardwareSpec, tile: TileId, timeout: float = 30.0):
        self.mesh, self.spec, self.tile, self.timeout = mesh, spec, tile, timeout
        self.region = mesh.tile_region(tile)
        self.sram = SramBook(self.region, spec.sram_bytes)
        self.store: dict[str, tuple[Layout, np.ndarray]] = {}
        self.links = None  # the tile's fabric (waferrt.fabric.links.Links), set by whoever runs it
        self.decoder: TileProgram | None = None
        self.loop = None  # a thread running the decoder (waferrt.actors.decoding.LoopThread) while it runs
        self.booked: list[str] = []  # the decode's SRAM bookings
        self.faults = FaultState(tile, self.region)
        self.tracer = None  # a waferrt.core.trace.Recorder between trace_start and trace_stop

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
                "fired": [fired_dict(r) for r in f.fired]}

    def kernel_faults(self, epoch: int) -> dict:
        """A kernel command `epoch` is about to start here: the faults due fire (a Trigger's step counts the
        kernel commands this tile runs); what is dead here (``dead()``), for the command's fault map."""
        self.faults.tick(epoch)
        return self.dead()

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

    def names(self) -> list[str]:
        return sorted(self.store)

    def sram_stats(self) -> dict:
        return {"tile": str(self.tile), **self.sram.stats()}

    # -- kernels ----------------------------------------------------------------------------------------
    def run(self, kernel, region: Region, args: dict, epoch: int, faults: FaultMap | None = None) -> dict:
        """Run a kernel on this tile's cores of `region`; `epoch` numbers the command (the same on every
        tile), so messages left over from an earlier, failed command are recognised and dropped. `faults`:
        what is dead in the region as the command starts (the same map on every tile of the command); a
        straggling tile (or a slow core of the region) is slower by its delay. Returns the cost and what the
        kernel printed; an error leaves as KernelFailed (waferrt.fabric.spmd.run_kernel: the kernel's line, the
        tile, the output so far)."""
        self.ensure_idle()
        ledger, links, span = kernel_parts(self.spec, self.links, self.tracer, kernel, epoch)
        self.new_epoch(epoch)
        ctx = Context(Span(region, self.region, links, self.mesh.region), ledger, self.store, tag=f"k{epoch}",
                      faults=faults)
        ctx.sram_free = self.sram.free_bytes()[self.region.window(ctx.local)]
        if delay := self.faults.delay_in(region):  # a straggling tile, or a slow core in the region
            time.sleep(delay)
        with span:
            _, printed = run_kernel(ctx, kernel, args, self.tile)
        return {"cost": ledger.snapshot(), "output": printed}

    def new_epoch(self, epoch: int) -> None:
        """Commands from now on are number `epoch`: the links drop what an earlier one left."""
        self.links.epoch = epoch

    def ensure_idle(self) -> None:
        """Raise if a decode loop runs this tile's program (kernels and a new set-up wait for its end)."""
        if self.loop is not None:
            raise RuntimeError(f"{self.tile} is decoding; stop the decode before running kernels on it")

    # -- LLM decode -------------------------------------------------------------------------------------
    def decode_setup(self, setup: DecodeSetup) -> list[int]:
        """Book SRAM for the decode stages this tile hosts and get ready to load them; returns the stages that
        need their weights. Set up again (after a re-plan), the stages that stay in their region keep their
        weights."""
        self.ensure_idle()
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

    def decode_swaps(self) -> int:
        """Swaps of experts NI-Balancer finished in this tile's MoE layers (waferrt.decode.moe)."""
        return self.decoder.expert_swaps() if self.decoder is not None else 0

    def decode_bytes(self) -> int:
        """Bytes of the decode's weight blocks and K/V caches that this tile holds."""
        return self.decoder.held_bytes() if self.decoder is not None else 0

    def pace(self) -> float | None:
        """Wall seconds per stage run lately (what the beats carry; None before a decode ran here)."""
        return self.decoder.pace if self.decoder else None

    # -- tracing ----------------------------------------------------------------------------------------
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


def fired_dict(rec: Fired) -> dict:
    """A fault that fired, as plain data (what ``dead()`` lists and a tile actor reports to its host)."""
    return {"index": rec.index, "fault": fault_dict(rec.fault), "step": rec.step, "at": rec.at, "tile": str(rec.tile)}
