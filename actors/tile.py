"""A tile: the cores of one rectangle of the mesh, their SRAM, their DSM blocks, and its fabric links.

Contract: :class:`Tile` is a plain class (unit tests construct it directly; ``waferrt.actors.remote``
makes it a Ray actor). It owns the SRAM book of its cores and the local blocks of every DSM tensor
that touches it, and runs SPMD kernels over the part of a region it holds, exchanging with neighbour
tiles only through its links. Every method returns plain data (numpy arrays, dicts).
"""

from __future__ import annotations

import numpy as np

from waferrt.core.layout import Layout, core_bytes
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Dir, MeshSpec, Region, TileId
from waferrt.core.spec import HardwareSpec
from waferrt.core.sram import SramBook
from waferrt.decode.program import StepResult, TileProgram
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.fabric.kernel import Cores


class Tile:
    def __init__(self, mesh: MeshSpec, spec: HardwareSpec, tile: TileId, timeout: float = 30.0):
        self.mesh, self.spec, self.tile, self.timeout = mesh, spec, tile, timeout
        self.region = mesh.tile_region(tile)
        self.sram = SramBook(self.region, spec.sram_bytes)
        self.store: dict[str, tuple[Layout, np.ndarray]] = {}
        self.links = None

    # -- fabric -----------------------------------------------------------------------------------------
    def bind(self, ipc_dir: str, tcp: bool = False) -> dict:
        """Open this tile's receive socket (tcp too when a neighbour tile is on another node); its addresses
        and the tile's public key."""
        from .fabric import ZmqLinks

        self.links = ZmqLinks(self.tile, self.timeout)
        return self.links.bind(ipc_dir, tcp)

    def admit(self, keys: dict[str, bytes]) -> None:
        """The neighbour tiles' public keys, by side: only they may talk to this tile."""
        self.links.admit({Dir[d]: k for d, k in keys.items()})

    def connect(self, peers: dict[str, str]) -> None:
        self.links.connect({Dir[d]: a for d, a in peers.items()})

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

    def get(self, name: str) -> np.ndarray:
        return self.store[name][1]

    def read(self, name: str, row: int, col: int) -> np.ndarray:
        """The block of the core at (row, col) of the tensor's region."""
        layout, blocks = self.store[name]
        rows, cols = self._local(layout)[1]
        return blocks[row - rows.start, col - cols.start]

    # -- kernels ----------------------------------------------------------------------------------------
    def run(self, kernel, region: Region, args: dict, epoch: int) -> dict:
        """Run a kernel on this tile's cores of `region`; `epoch` numbers the command (the same on every
        tile), so messages left over from an earlier, failed command are recognised and dropped."""
        ledger = Ledger(self.spec)
        self._new_epoch(epoch)
        ctx = Cores(region, self.region, self.links, ledger, self.store, tag=f"k{epoch}")
        kernel(ctx, **args)
        return ledger.snapshot()

    def _new_epoch(self, epoch: int) -> None:
        self.links.epoch = epoch

    # -- LLM decode -------------------------------------------------------------------------------------
    def decode_setup(self, setup: DecodeSetup) -> list[int]:
        """Book SRAM for the decode stages this tile hosts and get ready to load them; returns their
        stage indices."""
        self.decoder = TileProgram(setup, self.tile, self.links, Ledger(self.spec))
        hosted = [s for s in range(len(self.decoder.stages)) if self.decoder.hosts(s)]
        for s in hosted:
            for name, (region, nbytes) in stage_sram(setup, s).items():
                self.sram.reserve(name, region, nbytes)
        return hosted

    def decode_load(self, s: int, arrays: dict) -> None:
        self.decoder.load(s, arrays)

    def decode_step(self, epoch: int, items: list, resets: list[int] = ()) -> StepResult:
        self._new_epoch(epoch)
        tag = f"t{epoch}"
        for slot in resets:
            self.decoder.reset(slot)
        return self.decoder.step(tag, items)

    def names(self) -> list[str]:
        return sorted(self.store)

    def fabric_stats(self) -> dict:
        """Who tried to talk to this tile and what its fabric dropped (``ZmqLinks.stats``)."""
        return self.links.stats() if self.links is not None else {"tile": str(self.tile)}

    def sram_stats(self) -> dict:
        return {"tile": str(self.tile), **self.sram.stats()}

    def pid(self) -> int:
        import os

        return os.getpid()

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
        self.links = None
