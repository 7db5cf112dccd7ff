"""LocalDecoder: the wafer's decode without Ray -- one thread per tile, queues as links, the same loop.

Contract: ``LocalDecoder(config, weights, placement, collectives, lanes)`` builds every tile's
:class:`~waferrt.decode.TileProgram` over a :class:`~waferrt.fabric.LoopFabric` and loads the packed
weights; ``generate(requests, sampler, on_token)`` runs every tile's decode loop
(waferrt.serving.loop.run_tile) in its own thread, exactly as the tile actors do over Ray, and streams the
tokens back through :func:`~waferrt.serving.host.serve`. A tile thread that fails ends ``generate`` with
its error (re-raised, with the tile named in a note). ``trace=path`` records every tile's spans and writes
a Perfetto trace (waferrt.serving.trace). For the unit tier and for debugging a placement.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import replace

from waferrt.core.ledger import Ledger
from waferrt.core.trace import Recorder
from waferrt.decode.program import TileProgram
from waferrt.decode.setup import DecodeSetup, stage_weights
from waferrt.decode.streaming import WeightStore
from waferrt.decode.tracing import trace_program, untrace_program
from waferrt.fabric.comm import KTREE_FAST, Collectives
from waferrt.fabric.loop import LoopFabric
from waferrt.model.sampling import Sampler
from waferrt.model.sparse import AttentionMode

from .engine import HeadEngine, Submission, TokenEvent
from .host import serve
from .loop import run_tile
from .requests import Batch, Completion, GenRequest, GenStats, OnToken


class LocalDecoder:
    def __init__(self, config, weights, placement, collectives: Collectives = KTREE_FAST, lanes: int = 2):
        self.placement, self.lanes = placement, lanes
        self.setup = DecodeSetup.from_placement(placement, collectives)
        self.fabric = LoopFabric(placement.mesh)
        self.head = self.setup.stage_tiles()[0]
        self.programs = {t: TileProgram(self.setup, t, self.fabric.links(t), Ledger(placement.spec, placement.dtype))
                         for t in placement.mesh.tiles()}
        for s, raw in stage_weights(self.setup, weights):
            self.programs[self.setup.stage_tiles()[s]].load(s, raw)
        if self.setup.streaming:  # the weights stay off the wafer: MemoryX is an object of this process
            self.programs[self.head].attach(WeightStore(config, self.setup.embed, self.setup.dtype, weights))

    def use_prefill(self, on: bool = True) -> LocalDecoder:
        """Prefill whole prompts by MeshGEMM (waferrt.decode.prefill) instead of the decode's chunks."""
        return self._use(replace(self.setup, prefill=on))

    def use_attention(self, mode: AttentionMode) -> LocalDecoder:
        """Attend densely (the default) or by STAR's sparse attention (``AttentionMode.parse("sparse:64")``) in
        the decode and the MeshGEMM prefill, as WaferLLM.use_attention; the layers loaded already attend by it
        from their next step on."""
        self._use(replace(self.setup, attention=mode))
        for program in self.programs.values():
            for shard in program.layers.values():
                shard.attention = mode
        return self

    def _use(self, setup: DecodeSetup) -> LocalDecoder:
        self.setup = setup
        for program in self.programs.values():
            program.setup = setup
        return self

    def generate(self, requests: list[GenRequest], sampler: Sampler, on_token: OnToken | None = None,
                 keep_logits: bool = False, trace=None) -> tuple[list[Completion], GenStats]:
        batch = Batch(tuple(requests), sampler, keep_logits)
        return serve(_Threads(self), self.setup, self.placement.spec.clock_hz, batch, on_token, trace)


class _Threads:
    """One decode of a LocalDecoder: its tiles' loops as threads (the Decode protocol of serving.host)."""

    def __init__(self, dec: LocalDecoder):
        self.dec = dec
        self.engine = HeadEngine.of(dec.setup, dec.lanes)
        self.control, self.out, self.stop_flag = queue.Queue(), queue.Queue(), threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for t, program in self.dec.programs.items():
            program.records.clear()
            engine = self.engine if t == self.dec.head else None
            th = threading.Thread(target=self._run, args=(program, engine), name=str(t), daemon=True)
            th.start()
            self.threads.append(th)

    def _run(self, program: TileProgram, engine: HeadEngine | None) -> None:
        try:
            run_tile(program, engine, self.control, self.out.put, self.stop_flag)
        except BaseException as e:  # noqa: BLE001 - handed to the host's thread
            e.add_note(f"(in the decode loop of {program.tile})")
            self.out.put(e)

    def submit(self, subs: list[Submission]) -> None:
        for sub in subs:
            self.control.put(("submit", sub))

    def events(self, timeout: float) -> list[TokenEvent]:
        try:
            got = self.out.get(timeout=timeout)
        except queue.Empty:
            return []
        if isinstance(got, BaseException):
            raise got
        return got

    def stop(self) -> list:
        self.stop_flag.set()
        for th in self.threads:
            th.join()
        return [r for p in self.dec.programs.values() for r in p.records]

    def trace_start(self) -> None:
        for t, program in self.dec.programs.items():
            trace_program(program, Recorder(str(t)))

    def trace_stop(self) -> dict[str, list]:
        recs = {str(t): untrace_program(program) for t, program in self.dec.programs.items()}
        return {t: rec.take() if rec is not None else [] for t, rec in recs.items()}
