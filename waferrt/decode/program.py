"""The decode pipeline as every tile runs it: stages, routes between tiles, and one step of work.

Contract: a decode step carries a list of items ``(slot, token, pos, want_logits)``. Every item passes
the stages embed -> layer 0 -> ... -> layer L-1 -> head; each stage runs in its region's tile. Every tile
runs the same :meth:`TileProgram.step` on the same items and does its own part: the stages it hosts, and
the forwarding of activations that cross it on their way (dimension-order routes over neighbour tiles,
never a jump). Each tile takes its tasks in (stage, item) order: a global order in which every task's
inputs come from smaller tasks, so the pipeline cannot deadlock, and while one tile works on item i at a
late stage, the tile before it already works on item i+1 -- the requests in flight are pipelined. The
driver sends one command per step; the tiles exchange the activations themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Dir, MeshSpec, TileId

from .cost import handover_cost, pipeline_seconds
from .pack import Chunks
from .setup import DecodeSetup
from .shards import EmbedShard, LayerShard


@dataclass(frozen=True)
class StepResult:
    """What one tile reports of a decode step."""

    logits: dict[int, np.ndarray]  # item index -> logits (vocab,), from the head's tile only
    cycles: dict[tuple[int, int], float]  # (stage, micro-batch) -> modelled cycles, for the stages run here
    parts: int  # micro-batches the step was cut in
    wall: float  # seconds of the step on this tile
    busy: float  # of which not waiting for a neighbour
    cpu: float  # CPU seconds of this tile's process


MICRO_BATCH = 8


def micro_batches(n: int) -> list[np.ndarray]:
    """Item indices cut into consecutive micro-batches: at least two when there are two items or more (so
    consecutive tiles overlap), at most MICRO_BATCH items each (a long prompt goes in several)."""
    parts = 1 if n < 2 else max(2, cdiv(n, MICRO_BATCH))
    return [a for a in np.array_split(np.arange(n), parts) if len(a)]


def route(mesh: MeshSpec, a: TileId, b: TileId) -> list[TileId]:
    """Tiles from a to b, x first then y, one neighbour at a time (both ends included)."""
    path, cur = [a], a
    while cur != b:
        if cur.tx != b.tx:
            cur = TileId(cur.tx + (1 if b.tx > cur.tx else -1), cur.ty)
        else:
            cur = TileId(cur.tx, cur.ty + (1 if b.ty > cur.ty else -1))
        path.append(cur)
    return path


def _segments(tiles: tuple[TileId, ...]) -> list[tuple[TileId, list[int]]]:
    """Maximal runs of consecutive stages on one tile, in the order an item passes them."""
    out: list[tuple[TileId, list[int]]] = []
    for s, t in enumerate(tiles):
        if out and out[-1][0] == t:
            out[-1][1].append(s)
        else:
            out.append((t, [s]))
    return out


def _dir(a: TileId, b: TileId) -> Dir:
    return Dir.of_step(b.tx - a.tx, b.ty - a.ty)


class TileProgram:
    def __init__(self, setup: DecodeSetup, tile: TileId, links, ledger: Ledger):
        self.setup, self.tile, self.links, self.ledger = setup, tile, links, ledger
        self.stages = setup.stages()
        self.tiles = setup.stage_tiles()
        self.routes = [route(setup.mesh, self.tiles[s - 1], self.tiles[s]) if s else [self.tiles[0]]
                       for s in range(len(self.stages))]
        self.chunks = [Chunks(setup.config.dim, r.w) for _, _, r in self.stages]
        self.segments = _segments(self.tiles)
        self.layers: dict[int, LayerShard] = {}
        self.embed: EmbedShard | None = None

    def hosts(self, s: int) -> bool:
        return self.tiles[s] == self.tile

    def load(self, s: int, arrays: dict) -> None:
        kind, layer, region = self.stages[s]
        st = self.setup
        if kind == "layer":
            self.layers[s] = LayerShard(st.config, region, arrays, st.slots, st.kv_tokens, self.ledger,
                                        st.algo, st.k, st.dtype)
        else:
            self.embed = EmbedShard(st.config, region, arrays, self.ledger, st.algo, st.k, st.dtype)

    def reset(self, slot: int) -> None:
        """Forget the request in `slot` in every layer this tile hosts."""
        for shard in self.layers.values():
            shard.kv.reset(slot)

    def step(self, tag: str, items: list[tuple[int, int, int, bool]]) -> StepResult:
        """Run every item through the stages this tile hosts, in micro-batches (see micro_batches).
        Returns the logits of the items that want them (from the head's tile), the modelled cycles of
        each (stage, micro-batch) here, and the wall and busy (not waiting for neighbours) time.

        Tasks go in (segment, micro-batch, stage) order: every task's input comes from a smaller task, so
        no tile waits in a cycle, and a tile hands a micro-batch on as soon as its run of stages is done
        with it, then starts the next one while the following tile works on the first."""
        arr = np.array(items, dtype=np.int64).reshape(-1, 4)
        batches = micro_batches(len(items))
        x: dict[int, np.ndarray] = {}
        logits, cycles = {}, {}
        t0, cpu0, self._waited = time.perf_counter(), time.process_time(), 0.0
        segs = self.segments
        for g, (tile, stages) in enumerate(segs):
            path = self.routes[stages[0]]
            if tile != self.tile and self.tile not in path[1:-1]:
                continue
            for m, idx in enumerate(batches):
                before = self.ledger.cycles()
                if g and self.tile in path[1:]:  # the activations come over the fabric (to us or through us)
                    x[m] = self._pass_on(f"{tag}.{stages[0]}.{m}", path, x.get(m), stages[0])
                if tile != self.tile:
                    continue
                for s in stages:
                    if s != stages[0]:
                        x[m] = self._arrive(x[m], s)
                    x[m] = self._run(s, x.get(m), arr[idx], idx, logits)
                    cycles[(s, m)] = self.ledger.cycles() - before
                    before = self.ledger.cycles()
                if g + 1 < len(segs):
                    nxt = segs[g + 1][1][0]
                    vec = self.chunks[stages[-1]].join(x[m])  # (B, dim): the activations leave the region
                    self.links.send(_dir(self.tile, self.routes[nxt][1]), f"{tag}.{nxt}.{m}", [vec])
        wall = time.perf_counter() - t0
        return StepResult(logits, cycles, len(batches), wall, wall - self._waited, time.process_time() - cpu0)

    def _run(self, s: int, xb, batch: np.ndarray, idx: np.ndarray, logits: dict):
        """Stage s on a micro-batch: batch rows are (slot, token, pos, want), idx their item numbers."""
        kind = self.stages[s][0]
        if kind == "embed":
            return self.embed.lookup(batch[:, 1])
        if kind == "layer":
            return self.layers[s].forward(xb, batch[:, 0], batch[:, 2])
        want = batch[:, 3].astype(bool)
        if want.any():
            for i, row in zip(idx[want], self.embed.logits(xb[want]), strict=True):
                logits[int(i)] = row
        return xb

    def _pass_on(self, tag: str, path: list[TileId], xi, s: int):
        k = path.index(self.tile)
        t0 = time.perf_counter()
        (vec,) = self.links.recv(_dir(path[k], path[k - 1]), tag)
        self._waited += time.perf_counter() - t0
        if k + 1 < len(path):
            self.links.send(_dir(path[k], path[k + 1]), tag, [vec])
            return xi
        return self._arrive(np.asarray(vec), s)

    def _arrive(self, xb: np.ndarray, s: int) -> np.ndarray:
        """The activations of stage s-1 enter stage s's region: they cross the gap between the regions and
        are multicast down the rows. xb is the previous region's (B, cols, chunk), or the (B, dim) vectors
        that came over the fabric."""
        src, dst = self.stages[s - 1][2], self.stages[s][2]
        with self.ledger.op("handover"):
            self.ledger.add(handover_cost(self.ledger.spec, src, dst, 4 * self.setup.config.dim * xb.shape[0]))
        if xb.ndim == 3 and src.w == dst.w:
            return xb
        vec = xb if xb.ndim == 2 else self.chunks[s - 1].join(xb)
        return self.chunks[s].split(vec)


def merge_steps(results: list[StepResult], n_stages: int, clock_hz: float) -> tuple[dict[int, np.ndarray], float]:
    """Every tile's part of one step: the logits by item, and the step's modelled seconds (pipelined)."""
    logits, cycles = {}, {}
    for r in results:
        logits.update(r.logits)
        cycles.update(r.cycles)
    return logits, pipeline_seconds(cycles, n_stages, max(r.parts for r in results), clock_hz)
