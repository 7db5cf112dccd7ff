"""A tile's part of the decode, driven by what arrives: micro-batches flow tile to tile on their own.

Contract: the stages are embed -> layer 0 -> ... -> layer L-1 -> head (waferrt.decode.setup, named values of
waferrt.decode.stage); each runs
in its region's tile, and a *segment* is a run of consecutive stages on one tile. A micro-batch is
``meta`` (B, 5) int64 rows (columns named by ``decode.rows.Col``: slot, token, pos, want, request) and,
between stages, its activations.
It enters at the embedding (:meth:`TileProgram.enter`, on the head's tile, which also hosts the
embedding: the table is tied), runs the segment there, and goes over the fabric to the tile of the next
segment (a dimension-order route over neighbour tiles; tiles in between pass it on), tagged
``"mb<n>><stage>"``; every tile handles what arrives in order (:meth:`TileProgram.arrive`). When the head
stage has run, the logits of the items that want them come back to the caller. A micro-batch of items at
position 0 starts its requests afresh (each layer empties that slot's K/V cache first).

Every stage run books its modelled cycles (hand-over into the region included) as a
:class:`~waferrt.decode.schedule.StageRun` in ``records``, in the order this tile ran them, with what each
token would take alone; waferrt.decode.schedule.flow_seconds schedules them as the wafer would run them.
Links are any waferrt.fabric.links.Links (the loop fabric or the real one).

Faults (waferrt.faults.state, optional): the faults armed on the tile fire as micro-batches arrive
(``tick``); a stage whose region holds a dead core or link raises CoreFailed / LinkFailed naming what was
lost instead of running; a straggling tile sleeps its delay per stage (a straggling core: per stage whose
region holds it). ``pace`` is the tile's recent wall time per run of its slowest stage (its heartbeat carries
it; the host spots a straggler). After a re-plan, ``adopt``
keeps the loaded stages whose region did not move (only the others need their weights again). While
``trace`` holds a recorder (waferrt.decode.tracing), every stage run and every micro-batch's visit is a span too.

Weight streaming (``setup.streaming``): the tile holds no weights; ``attach(store)`` gives it the off-wafer
memory (a waferrt.decode.streaming.WeightStore, or the actors' client of the MemoryX actor) and every stage
takes its block from it when it runs, then lets it go; the stage books its compute and, when its block's
stream outlasts that, the difference (op "stream"). Every stage is on one region, so tokens take turns on
it: a token's cycles alone are its share of its micro-batch's run (the block streamed once for all)."""

from __future__ import annotations

import time

import numpy as np

from waferrt.core.cost import Cost
from waferrt.core.dtypes import stored_nbytes
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Dir, MeshSpec, TileId
from waferrt.fabric.comm import LineComm, Span
from waferrt.faults.errors import CoreFailed, LinkFailed
from waferrt.faults.model import CoreFailure
from waferrt.faults.state import FaultState

from .cost import alone_cycles, handover_bytes, handover_cost
from .kvcache import PromptChunk
from .moe import MoELayerShard
from .pack import Chunks
from .prefill import layer_step, prefill_item_cycles, prefill_runs
from .routed_cost import routed_alone_cycles
from .rows import Col
from .schedule import Item, StageRun
from .setup import DecodeSetup, pack_stage
from .shards import EmbedShard, Items, LayerShard, widen
from .stage import StageKind, entries
from .streaming import stage_cycles, streamed_bytes, streamed_logits
from .tracing import microbatch_span, stage_span


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


def crossings(setup: DecodeSetup) -> set[tuple[TileId, Dir]]:
    """The tile borders the micro-batches cross: (tile, the side they leave it by)."""
    tiles, out = setup.stage_tiles(), set()
    for s in range(1, len(tiles)):  # (the head's logits stay on its tile, where the next token enters)
        path = route(setup.mesh, tiles[s - 1], tiles[s])
        out |= {(a, _dir(a, b)) for a, b in zip(path, path[1:])}
    return out


def segments(tiles: tuple[TileId, ...]) -> list[list[int]]:
    """Maximal runs of consecutive stages on one tile, in the order an item passes them."""
    out: list[list[int]] = []
    for s, t in enumerate(tiles):
        if out and tiles[out[-1][0]] == t:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def _dir(a: TileId, b: TileId) -> Dir:
    return Dir.of_step(b.tx - a.tx, b.ty - a.ty)


def _tag(mb: int, stage: int) -> str:
    return f"mb{mb}>{stage}"


def _untag(tag: str) -> tuple[int, int]:
    mb, stage = tag[2:].split(">")
    return int(mb), int(stage)


class TileProgram:
    def __init__(self, setup: DecodeSetup, tile: TileId, links, ledger: Ledger, faults: FaultState | None = None):
        self.setup, self.tile, self.links, self.ledger = setup, tile, links, ledger
        self.faults = faults  # what is armed and dead on this tile (waferrt.faults.state)
        self.stages = setup.stages()
        self.tiles = setup.stage_tiles()
        self.routes = [route(setup.mesh, self.tiles[s - 1], self.tiles[s]) if s else [self.tiles[0]]
                       for s in range(len(self.stages))]
        self.entries = entries(self.stages)  # each stage as a token enters it (decode.cost.token_cost)
        self.chunks = [Chunks(setup.config.dim, st.region.w) for st in self.stages]
        self.segment_of = {seg[0]: seg for seg in segments(self.tiles)}  # first stage -> its segment
        self.layers: dict[int, LayerShard] = {}
        self.embed: EmbedShard | None = None
        self.head: EmbedShard | None = None  # an untied head's table (a tied head runs on self.embed)
        self.store = None  # the off-wafer weights of a streaming decode (attach)
        self.records: list[StageRun] = []
        self.paces: dict[int, float] = {}  # stage -> its wall seconds per run lately (an EMA)
        self.trace = None  # a waferrt.core.trace.Recorder while tracing (waferrt.decode.tracing), else None
        self._alone_memo: dict[tuple[int, int, bool], float] = {}  # (stage, position, wants logits) -> cycles
        self._typical: dict[int, float] = {}  # MoE layer stage -> routed_alone_cycles of its region
        self._handovers: dict[tuple[int, int], Cost] = {}  # (stage, items) -> handover_cost

    def hosts(self, s: int) -> bool:
        return self.tiles[s] == self.tile

    def adopt(self, old: TileProgram) -> list[int]:
        """Keep the loaded stages of `old` (this tile's program before a re-plan) that this program hosts in
        the same region; returns the hosted stages that still need their weights."""
        for s, stage in enumerate(self.stages):
            if not self.hosts(s):
                continue
            was = next((t for t, st in enumerate(old.stages) if st == stage and old.hosts(t)), None)
            if stage.kind is StageKind.LAYER and was in old.layers:
                self.layers[s] = old.layers[was]
            elif stage.kind is StageKind.EMBED and was is not None and old.embed is not None:
                self.embed = old.embed
            elif stage.kind is StageKind.HEAD and was is not None and old.head is not None:
                self.head = old.head
        return [s for s in range(len(self.stages)) if self.hosts(s) and not self.loaded(s)]

    def attach(self, store) -> None:
        """The off-wafer memory the blocks of a streaming decode come from (see the module docstring)."""
        self.store = store

    def loaded(self, s: int) -> bool:
        if self.setup.streaming:
            return self.store is not None
        kind = self.stages[s].kind
        if kind is StageKind.HEAD and self.setup.head is not None:  # an untied head holds its own table
            return self.head is not None
        return s in self.layers if kind is StageKind.LAYER else kind is StageKind.HEAD or self.embed is not None

    def tick(self, step: int | None) -> None:
        """Let the faults armed on this tile fire at `step` (None: only their timers)."""
        if self.faults is not None:
            self.faults.tick(step)

    def load(self, s: int, raw) -> None:
        """Stage s's float32 weights (waferrt.decode.setup.stage_weights) into its cores' blocks."""
        kind, region, st = self.stages[s].kind, self.stages[s].region, self.setup
        arrays = pack_stage(st, s, raw)
        if kind is StageKind.LAYER:
            shard = MoELayerShard if st.config.moe else LayerShard
            self.layers[s] = shard(st.decoding, region, arrays, st.kv, self.ledger)
            self.layers[s].balance = st.balance
            if not st.config.moe:  # widened once here, largest first, not on first use (shards.widen)
                widen(arrays, st.dtype)
        elif kind is StageKind.HEAD:
            self.head = EmbedShard(st.config, region, arrays, self.ledger, st.collectives, st.dtype)
        else:
            self.embed = EmbedShard(st.config, region, arrays, self.ledger, st.collectives, st.dtype)

    def expert_swaps(self) -> int:
        """How many swaps of experts NI-Balancer finished in the MoE layers this tile hosts."""
        return sum(len(sh.swaps) for sh in self.layers.values() if isinstance(sh, MoELayerShard))

    def held_bytes(self) -> int:
        """Bytes of the weight blocks (at the storage dtype: what the cores hold) and K/V caches of the stages
        this tile hosts."""
        shards = [*self.layers.values(), *(sh for sh in (self.embed, self.head) if sh is not None)]
        weights = sum(stored_nbytes(a, self.setup.dtype) for sh in shards for a in sh.arrays.values())
        return weights + sum(sh.kv.nbytes for sh in self.layers.values())

    # -- what happens to a micro-batch ---------------------------------------------------------------------
    def enter(self, mb: int, meta: np.ndarray) -> dict[int, np.ndarray] | None:
        """Micro-batch `mb` enters at the embedding (this tile hosts it): run this tile's first segment and
        send it on. Returns the logits (by item) if the whole chain ran here."""
        if not self.hosts(0):
            raise ValueError(f"{self.tile} does not host the embedding; micro-batches enter at {self.tiles[0]}")
        self.tick(mb)
        return self._run(mb, 0, meta, None)

    def arrive(self, tag: str, arrays: list[np.ndarray]) -> tuple[int, dict[int, np.ndarray]] | None:
        """A micro-batch came over a link: pass it on toward its stage's tile, or run the segment here.
        Returns (mb, logits by item) when the head ran on it here, else None."""
        mb, s = _untag(tag)
        self.tick(mb)
        path = self.routes[s]
        k = path.index(self.tile)
        if k + 1 < len(path):  # on its way through this tile
            self.links.send(_dir(self.tile, path[k + 1]), tag, arrays)
            return None
        meta, vec = arrays
        logits = self._run(mb, s, meta, self.chunks[s].split(np.asarray(vec)))
        return None if logits is None else (mb, logits)

    def _run(self, mb: int, s: int, meta: np.ndarray, x: np.ndarray | None) -> dict[int, np.ndarray] | None:
        """Stages s.. of this tile's segment on the micro-batch; then send it to the next segment's tile."""
        segment = self.segment_of[s]
        logits, items = None, Items.of(meta[:, Col.SLOT], meta[:, Col.POS])  # the same for every layer of the segment
        t_mb = time.time_ns() if self.trace is not None else 0
        for st in segment:
            before, t0 = self.ledger.cycles(), time.time_ns() if self.trace is not None else 0
            if st:
                self._handover(st, len(meta))
                if st != s and self.stages[st - 1].region.w != self.stages[st].region.w:  # re-cut for this region
                    x = self.chunks[st].split(self.chunks[st - 1].join(x))
            if self.faults is not None and not self.faults.quiet:
                self._alive(st)
            wall = time.perf_counter()
            x, logits = self._stage(st, meta, x, items)
            self._timed(st, time.perf_counter() - wall)
            cycles = self.ledger.cycles() - before
            self.records.append(StageRun(mb, st, self.stages[st].region, len(self.records), cycles,
                                         self._items(st, meta, cycles)))
            if self.trace is not None:
                stage_span(self.trace, self.stages[st], self.records[-1], t0)
        nxt = segment[-1] + 1
        if nxt < len(self.stages):
            vec = self.chunks[segment[-1]].join(x)  # (B, dim): the activations leave the region
            self.links.send(_dir(self.tile, self.routes[nxt][1]), _tag(mb, nxt), [meta, vec])
        if self.trace is not None:
            microbatch_span(self.trace, mb, segment, len(meta), t_mb)
        return logits

    def _timed(self, s: int, seconds: float) -> None:
        self.paces[s] = seconds if s not in self.paces else 0.8 * self.paces[s] + 0.2 * seconds

    @property
    def pace(self) -> float | None:
        """This tile's wall seconds per stage run lately, of its slowest stage: of its layer stages (alike on
        every tile), or of its others when it hosts no layer. The host compares them across tiles to spot a
        straggler -- a slow tile slows all its stages, a slow core the one whose region holds it."""
        layers = [p for s, p in self.paces.items() if self.stages[s].kind is StageKind.LAYER]
        return max(layers or self.paces.values(), default=None)

    def _alive(self, s: int) -> None:
        """Stage s's cores and links all work (else CoreFailed / LinkFailed naming what is lost); a straggling
        tile is slower by its delay."""
        stage = self.stages[s]
        region, what = stage.region, stage.what
        dead = self.faults.hit(region)
        if isinstance(dead, CoreFailure):
            held = ((f"{what}'s weight blocks", f"{what}'s K/V caches") if stage.kind is StageKind.LAYER
                    else (f"{what}'s table",))
            raise CoreFailed(dead.core, held, f"{self.tile}, in the region {region} of {what}")
        if dead is not None:
            raise LinkFailed(dead.a, dead.b, f"{self.tile}, inside the region {region} of {what}")

    def _items(self, s: int, meta: np.ndarray, cycles: float) -> tuple[Item, ...]:
        """The micro-batch's tokens at stage s, each with the cycles it would take there alone (streaming: its
        share of the run's `cycles`)."""
        rows = meta.tolist()
        if self.setup.streaming:
            return tuple(Item(req, pos, bool(want), cycles / len(meta)) for _, _, pos, want, req in rows)
        whole = {}  # a prompt chunk's item -> its share of the chunk's prefill
        if self.setup.prefill and self.stages[s].kind is StageKind.LAYER:
            for run in prefill_runs(meta):
                share = self._prefill_item(s, PromptChunk(int(meta[run[0], Col.POS]), len(run)))
                whole.update(dict.fromkeys(run.tolist(), share))
        routed = self._routed(s) if not whole else 0.0
        return tuple(Item(req, pos, bool(want), whole[i] if i in whole else self._alone(s, pos, bool(want)) + routed)
                     for i, (_, _, pos, want, req) in enumerate(rows))

    def _routed(self, s: int) -> float:
        """An MoE layer's routed work as it ran, instead of the closed forms' typical token: each token's
        share of the micro-batch's (decode.moe.MoEStep: the busiest block, the links as routed, NI-Balancer's
        migration) less what alone_cycles holds for them (0 for any other stage)."""
        shard = self.layers.get(s)
        if not isinstance(shard, MoELayerShard) or shard.step is None:
            return 0.0
        if s not in self._typical:
            self._typical[s] = routed_alone_cycles(self.ledger.spec, self.setup.decoding, self.stages[s].region)
        return shard.step.share_cycles() - self._typical[s]

    def _alone(self, s: int, pos: int, want: bool) -> float:
        """decode.cost.alone_cycles of a token at stage s (kept: a stage sees the same positions again)."""
        key = (s, pos, want)
        if key not in self._alone_memo:
            self._alone_memo[key] = alone_cycles(self.ledger.spec, self.setup.decoding, self.entries[s], pos, want)
        return self._alone_memo[key]

    def _prefill_item(self, s: int, chunk: PromptChunk) -> float:
        """A prompt token's share of stage s's prefill of a prompt `chunk` (decode.prefill)."""
        return prefill_item_cycles(self.ledger.spec, self.setup.decoding, self.entries[s], chunk)

    def _stage(self, s: int, meta: np.ndarray, x, items: Items):
        """Stage s on a micro-batch (`items`: its rows as the layers see them) -> (its activations out, the
        logits by item if it is the head)."""
        kind = self.stages[s].kind
        if self.faults is not None and (delay := self.faults.delay_in(self.stages[s].region)):  # slow, not dead
            time.sleep(delay)
        if self.setup.streaming:
            return self._streamed(s, meta, x)
        if kind is StageKind.EMBED:
            return self.embed.lookup(meta[:, Col.TOKEN]), None
        if kind is StageKind.LAYER and self.setup.prefill:
            return layer_step(self.layers[s], x, meta), None
        if kind is StageKind.LAYER:
            return self.layers[s].run(x, items), None
        want = np.flatnonzero(meta[:, Col.WANT])
        if not len(want):
            return x, {}
        head = self.embed if self.head is None else self.head
        return x, dict(zip(want.tolist(), head.logits(x[want]), strict=True))

    def _streamed(self, s: int, meta: np.ndarray, x):
        """Stage s of a streaming decode: its block comes in from the store, runs, and leaves the buffer."""
        st, stage = self.setup, self.stages[s]
        kind, region = stage.kind, stage.region
        want = np.flatnonzero(meta[:, Col.WANT])
        if kind is StageKind.HEAD and not len(want):  # no token wants logits: the head's blocks need not come in
            return x, {}
        before, logits = self.ledger.cycles(), None
        if kind is StageKind.EMBED:
            x = self.store.rows(meta[:, Col.TOKEN])
        elif kind is StageKind.LAYER:
            arrays = self.store.layer(stage.layer)
            if s not in self.layers:  # its K/V stays on the wafer from the first run on
                self.layers[s] = LayerShard(st.decoding, region, arrays, st.kv, self.ledger)
            shard = self.layers[s]
            shard.arrays = arrays
            x = shard.forward(x, meta[:, Col.SLOT], meta[:, Col.POS])
            shard.arrays = {}
        else:
            comm = LineComm("x", Span.of(region), self.ledger, fast=st.collectives.fast)
            chunks = (self.store.head(k) for k in range(self.store.head_count))
            with self.ledger.op("head"):
                out = streamed_logits(comm, st.collectives, st.config, chunks, x[want], st.dtype)
            logits = dict(zip(want.tolist(), Chunks(st.config.vocab_size, region.h).join(out), strict=True))
        compute = self.ledger.cycles() - before
        wait = stage_cycles(self.ledger.spec, compute, streamed_bytes(st.config, kind, st.dtype, len(meta))) - compute
        if wait > 0:
            with self.ledger.op("stream"):
                self.ledger.add(Cost(cycles=wait))
        return x, logits

    def _handover(self, s: int, items: int) -> None:
        """The activations of stage s-1 enter stage s's region: they cross the gap between the regions and
        are multicast down its rows (decode.cost.handover_cost, the one formula)."""
        if (s, items) not in self._handovers:
            src, dst = self.stages[s - 1].region, self.stages[s].region
            self._handovers[s, items] = handover_cost(self.ledger.spec, src, dst,
                                                         handover_bytes(self.setup.config, items))
        with self.ledger.op("handover"):
            self.ledger.add(self._handovers[s, items])
