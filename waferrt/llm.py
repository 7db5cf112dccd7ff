"""LLM generation on the emulated wafer: the join of the scheduler's placement, the decode and the tile actors.

Contract: :class:`WaferLLM` takes a Llama model (config + float32 weights) and a scheduler Placement;
``open()`` starts the tile actors (``waferrt.Wafer``) and books every stage's SRAM, ``load(weights)``
ships each stage's weights to its tile once (the tiles cut them into their cores' blocks, side by side);
with weights given to the constructor, ``with WaferLLM(...) as llm`` does both. ``generate(requests,
sampler, on_token)`` then runs the decode on the tiles by themselves: one Ray call per tile starts their
decode loops, one hands the requests to the head's tile, and the tokens stream back to the host's inbox as
they are sampled on the wafer (waferrt.serving.host.serve) -- no Ray call per token, no host in the loop.
A tile that fails, dies or freezes ends ``generate`` within seconds with an error that names it
(:class:`~waferrt.actors.watch.TileFailed`); the tokens already produced come with the error
(``error.completions``). It reaches the tiles only through ``Wafer.call`` with the
:class:`~waferrt.actors.tile.Tile` methods themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from waferrt.actors.tile import Tile
from waferrt.decode.setup import DecodeSetup, stage_weights, weight_bytes
from waferrt.decode.streaming import head_chunks
from waferrt.fabric.comm import KTREE_FAST, Collectives
from waferrt.faults.model import Straggler
from waferrt.model.config import LlamaConfig
from waferrt.model.sampling import Sampler
from waferrt.model.sparse import AttentionMode
from waferrt.serving.engine import Submission, TokenEvent
from waferrt.serving.host import serve
from waferrt.serving.requests import Batch, Completion, GenRequest, GenStats, OnToken

from .recovery import assess, recover
from .runtime import Launch, Wafer

LLM_LAUNCH = Launch(timeout=120.0)  # a decode's tiles wait longer for a neighbour than a kernel's


class WaferLLM:
    def __init__(self, config: LlamaConfig, weights, placement, collectives: Collectives = KTREE_FAST,
                 lanes: int | None = None, launch: Launch = LLM_LAUNCH):
        """`launch`: the Ray to run the tiles on, a tile's timeout, the most tiles (default: a new Ray in this
        process, 120 s). `lanes`: micro-batches in flight at once (default: 2, so that the tiles of the stages
        compute side by side; 1 when one tile runs every stage of a placement in SRAM, where a second lane
        would only halve every BLAS call -- not for weight streaming, whose schedule has two)."""
        self.config, self.weights, self.placement = config, weights, placement
        self.setup = DecodeSetup.from_placement(placement, collectives)
        alone = len(set(self.setup.stage_tiles())) == 1 and not self.setup.streaming
        self.lanes = lanes or (1 if alone else 2)
        self.head = self.setup.stage_tiles()[0]  # a placement the decode cannot run fails here, before Ray
        self.wafer = Wafer(placement.spec, placement.mesh, launch=launch)
        self.ray_calls = 0  # Ray calls made to the tiles by generate (start, submit, stop; tracing's)
        self.memoryx = None  # the off-wafer weight memory's actor of a streaming placement
        self._memoryx_cut = None  # (region, dtype, id of the weights) that actor holds

    def use_prefill(self, on: bool = True) -> WaferLLM:
        """Prefill whole prompts (up to waferrt.decode.prefill.PREFILL_MAX_TOKENS tokens) by MeshGEMM instead of
        passing them through the decode's GEMVs in chunks; before open() (the tiles take the setup then)."""
        if self.wafer.tiles:
            raise RuntimeError("use_prefill() comes before open(): the tiles take the decode's setup when they start")
        self.setup = replace(DecodeSetup.from_placement(self.placement, self.setup.collectives, on),
                             attention=self.setup.attention)
        return self

    def use_attention(self, mode: AttentionMode) -> WaferLLM:
        """Attend densely (the default) or by STAR's sparse attention (``AttentionMode.parse("sparse:64")``) in
        every decode step and MeshGEMM prefill; before open(). Its top-K lists need SRAM the placement must leave
        (``plan(..., options=PlanOptions(attention=mode))``), else the tiles' booking overflows naming them."""
        if self.wafer.tiles:
            raise RuntimeError("use_attention() comes before open(): the tiles take the decode's setup when they start")
        self.setup = replace(self.setup, attention=mode)
        return self

    def __enter__(self) -> WaferLLM:
        if not self.wafer.tiles:
            self.open()
            if self.weights is not None:
                self.load(self.weights)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, progress: Callable[[str], None] | None = None) -> WaferLLM:
        say = progress or (lambda msg: None)
        mesh = self.placement.mesh
        say(f"starting {len(mesh.tiles())} tile actors for {mesh}")
        self.wafer.open(progress=lambda i, n: say(f"tile actors up: {i}/{n}"), node_ids=self._node_ids())
        try:
            self.wafer.on_every_tile(Tile.decode_setup, self.setup)
        except BaseException:
            self.close()
            raise
        return self

    def _node_ids(self) -> dict:
        names = {name for _, name in self.placement.tile_nodes}
        return {} if len(names) <= 1 else dict(self.placement.tile_nodes)

    def load(self, weights, progress: Callable[[str], None] | None = None, stages: list[int] | None = None) -> int:
        """Every stage's weights (or those of `stages`) to its tile, all at once; the tiles cut them into their
        cores' blocks side by side. Weights mapped from the dequantised cache go to the tiles on this machine
        by reference (they map the file themselves: no copy on the way); others go through the host once.
        Returns the bytes of weights sent (what the wafer's ingress carries)."""
        from waferrt.model.npcache import by_reference

        say = progress or (lambda msg: None)
        if self.setup.streaming:
            return self._stream_from(weights, say)
        tiles, here = self.setup.stage_tiles(), self.wafer.local_tiles()
        todo = [(s, raw) for s, raw in stage_weights(self.setup, weights) if stages is None or s in stages]
        calls = [(tiles[s], Tile.decode_load, (s, by_reference(raw) if tiles[s] in here else raw)) for s, raw in todo]
        self.wafer.call(calls, progress=lambda i, n: say(f"weights into core SRAM: {i}/{n} regions"))
        self.weights = weights
        return sum(weight_bytes(raw) for _, raw in todo)

    def _stream_from(self, weights, say) -> int:
        """Weight streaming: the weights go to a MemoryX actor (off the wafer), the region's tile pulls them from
        it block by block as the stages run; nothing is loaded into SRAM up front (0 bytes). Called again (a
        recovery sets the decode up again), the region's tile attaches anew: to the same actor while the
        region and weights are the same, else to a new one cut for the new region (the old one is stopped)."""
        from waferrt.actors.memoryx import start_memoryx, stop_memoryx
        from waferrt.model.npcache import by_reference

        st = self.setup
        cut = (st.embed, st.dtype, id(weights))  # what the MemoryX actor holds: these weights cut for this region
        if self.memoryx is None or self._memoryx_cut != cut:  # a re-plan that moved the region: start it afresh
            say("weights into MemoryX (off-wafer memory): they stream into the region as the stages run")
            old, self.memoryx = self.memoryx, start_memoryx(st.config, st.embed, st.dtype, by_reference(weights))
            self._memoryx_cut = cut
            if old is not None:
                stop_memoryx(old)
        head_count = len(head_chunks(st.config, st.embed, st.dtype))
        self.wafer.call([(self.head, Tile.decode_attach, (self.memoryx, head_count))])
        self.weights = weights
        return 0

    def adopt(self, placement) -> None:
        """Run on this placement from now on (a re-plan after a fault: the same mesh, regions moved)."""
        self.placement = placement
        self.setup = replace(DecodeSetup.from_placement(placement, self.setup.collectives, self.setup.prefill),
                             attention=self.setup.attention)
        self.head = self.setup.stage_tiles()[0]

    def inject(self, fault) -> int:
        """Arm a fault on the tiles (waferrt.Wafer.inject); generate recovers from it (or, under a fail-fast
        plan, stops at it)."""
        return self.wafer.inject(fault)

    def faults(self, plan, node_loss: Callable[[int], None] | None = None):
        """``with llm.faults(plan) as session:`` (waferrt.Wafer.faults); ``session.log`` after generate. A
        NodeLoss(i) loses the placement's i-th node (``placement.nodes``), ``node_loss(i)`` removes it."""
        nodes = [n.name for n in self.placement.nodes] if self._node_ids() else None  # else: the wafer's list
        return self.wafer.faults(plan, node_loss, nodes)

    def close(self) -> None:
        if self.memoryx is not None:
            from waferrt.actors.memoryx import stop_memoryx

            memoryx, self.memoryx = self.memoryx, None
            stop_memoryx(memoryx)
        self.wafer.close()

    def expert_swaps(self) -> int:
        """Swaps of experts NI-Balancer finished on the tiles so far (``Placement.balance``)."""
        return sum(self.wafer.call([(t, Tile.decode_swaps, ()) for t in self.wafer.tiles]))

    def generate(self, requests: list[GenRequest], sampler: Sampler, on_token: OnToken | None = None,
                 keep_logits: bool = False, trace=None) -> tuple[list[Completion], GenStats]:
        """The requests decoded on the tiles; ``trace``: a path to write a Perfetto trace of the run to (or
        True: keep it in ``stats.trace`` only; waferrt.serving.trace)."""
        batch = Batch(tuple(requests), sampler, keep_logits)
        return serve(_OnTiles(self), self.setup, self.placement.spec.clock_hz, batch, on_token, trace)

    def decoder(self):
        """A decode on the tiles to drive by hand (the Decode protocol of waferrt.serving.host, recovering from
        faults, plus ``cancel(index)`` and ``runs_so_far()``): what a server keeps running (waferrt.server)."""
        return _OnTiles(self)


class _OnTiles:
    """One decode on the tile actors (the Decode protocol of waferrt.serving.host, recovering from faults)."""

    def __init__(self, llm: WaferLLM):
        from .inject import FaultSession

        self.llm, self.wafer = llm, llm.wafer
        self.session = self.wafer.session or FaultSession(self.wafer)  # real failures are recovered too
        self.tokens = 0  # tokens received (the host's step, for node losses)
        self.fruitless = 0  # recoveries since the last token
        self.handled: set[int] = set()  # the fault events a recovery has taken on (FaultEvent.index)

    @property
    def setup(self) -> DecodeSetup:
        return self.llm.setup

    @property
    def log(self):
        return self.session.log

    def inject(self, fault) -> int:
        """Arm `fault` on the tiles as a fault of this decode: its number in ``log``. With no faults armed
        before, the wafer takes this decode's session, so the fault shows as armed at once and, when it fires,
        is the event that is detected and recovered (``Wafer.inject`` alone would start a session of its own
        that this decode never reads)."""
        if self.wafer.session is None:
            self.wafer.session = self.session
        return self.wafer.inject(fault)

    def recover(self, error: Exception) -> list:
        return recover(self, error)

    def _call(self, calls: list) -> list:
        self.llm.ray_calls += len(calls)
        return self.wafer.call(calls)

    def start(self) -> None:
        self.epoch = epoch = self.wafer.next_epoch()
        self._call([(t, Tile.decode_start, (epoch, self.llm.lanes)) for t in self.wafer.tiles])

    def submit(self, subs: list[Submission]) -> None:
        self._call([(self.llm.head, Tile.decode_submit, (subs,))])

    def cancel(self, index: int) -> None:
        """Stop request `index` (its slot is freed once its tokens in flight come back: a finish "cancelled")."""
        self._call([(self.llm.head, Tile.decode_cancel, (index,))])

    def runs_so_far(self, since: dict) -> list:
        """The stage runs every tile's running loop booked since ``since[tile]`` (a count, advanced here)."""
        got = self._call([(t, Tile.decode_runs, (since.get(t, 0),)) for t in self.wafer.tiles])
        for t, runs in zip(self.wafer.tiles, got):
            since[t] = since.get(t, 0) + len(runs)
        return [r for runs in got for r in runs]

    def events(self, timeout: float) -> list[TokenEvent]:
        from waferrt.actors.watch import TileFailed

        out = []
        for msg in self.wafer.listen(timeout):
            if msg["k"] == "fault":
                assess(self.session, self.session.on_message(msg), self.llm.placement)
            elif msg.get("e") != self.epoch:  # from the loops of an attempt that a fault ended
                continue
            elif msg["k"] == "err":
                self.wafer.failed = TileFailed(msg["tile"], f"failed in its decode loop: {msg['type']}: "
                                                            f"{msg['msg']}")
                raise self.wafer.failed
            else:
                out += [TokenEvent(i, tok, fin, None if lg is None else np.frombuffer(lg, np.float32))
                        for i, tok, fin, lg in msg["ev"]]
        if out:
            self.tokens += sum(ev.token >= 0 for ev in out)
            self.fruitless = 0
        self.session.tick(self.tokens)
        if self.wafer.failed is not None:  # a node loss the host carried out: its tiles are gone
            raise self.wafer.failed
        self.session.straggling(self.wafer.watch.slow())
        return out

    def stop(self) -> list:
        if self.wafer.failed is not None:
            return self._settle()
        self._last_look()
        return [r for runs in self._call([(t, Tile.decode_stop, ()) for t in self.wafer.tiles]) for r in runs]

    def _last_look(self) -> None:
        """A straggler that fired in the decode's last steps has not shown in a beat yet (they come every
        0.25 s): when one fired and is not found yet, ask every tile's pace once more."""
        if any(isinstance(e.fault, Straggler) for e in self.session.log.pending()):
            paces = self._call([(t, Tile.pace, ()) for t in self.wafer.tiles])
            self.wafer.watch.note_paces(dict(zip(self.wafer.tiles, paces)))
            self.session.straggling(self.wafer.watch.slow())

    def _settle(self) -> list:
        """After a failure that ended the run (fail-fast): when it was a tile's decode loop that failed (a dead
        core or link in its region, a corrupt payload) and every tile still answers, end the loops and leave
        the wafer usable -- what died stays dead, and the next generate meets it and recovers. A lost tile
        keeps the wafer failed (the tiles cannot finish together; closing the wafer ends them)."""
        from waferrt.actors.watch import TileDied, TileStalled

        if isinstance(self.wafer.failed, (TileDied, TileStalled)) or self.wafer.dead_tiles():
            return []
        self.wafer.failed = None
        return [r for runs in self._call([(t, Tile.decode_abort, ()) for t in self.wafer.tiles]) for r in runs]

    def trace_start(self) -> None:
        self._call([(t, Tile.trace_start, ()) for t in self.wafer.tiles])

    def trace_stop(self) -> dict[str, list]:
        return {str(t): evs for t, evs in zip(self.wafer.tiles, self._call([(t, Tile.trace_stop, ())
                                                                             for t in self.wafer.tiles]))}
