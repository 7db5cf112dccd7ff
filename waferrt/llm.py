"""LLM generation on the emulated wafer (and the same loop on the numpy reference).

Contract: :class:`WaferLLM` places a Llama model (the scheduler's Placement), starts the tile actors,
loads every region's weight blocks into its tile and generates: requests enter by continuous batching
(``waferrt.scheduler.admission``: a request that the KV capacity cannot hold is refused with the reason
before it starts), each decode step is one command to every tile (a prompt enters the pipeline whole,
token after token, through the decode path), logits leave at the head's tile, and the host samples.
:func:`generate_reference` runs the same requests on :class:`~waferrt.model.ReferenceModel`. Both sample
request i with ``numpy.random.default_rng([seed, i])``, so both give the same tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .model import ReferenceModel, Sampler
from .model.config import LlamaConfig
from .pipeline import DecodeSetup

OnToken = Callable[[int, int, str], None]  # (request index, token id, finish reason: "" while it goes on)


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()


@dataclass
class Completion:
    prompt_ids: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    finish: str = ""  # "stop" (a stop token), "length" (max_new_tokens) or "refused: <reason>"


@dataclass
class GenStats:
    wall_s: float = 0.0
    modelled_s: float = 0.0  # what the steps would take on the modelled wafer
    steps: int = 0
    tokens: int = 0  # generated tokens
    token_latency_s: list[float] = field(default_factory=list)  # wall time of each decode-only step

    @property
    def wall_tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def wafer_tokens_per_s(self) -> float:
        return self.tokens / self.modelled_s if self.modelled_s else 0.0


def _rng(sampler: Sampler, i: int) -> np.random.Generator:
    return np.random.default_rng([sampler.seed, i])


def _finished(req: GenRequest, done: Completion, token: int) -> str:
    if token in req.stop_ids:
        return "stop"
    return "length" if len(done.tokens) >= req.max_new_tokens else ""


def generate_reference(config: LlamaConfig, weights, requests: list[GenRequest], sampler: Sampler,
                       on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
    """The single-process numpy reference: each request prefilled with the decode step, then decoded."""
    model, stats = ReferenceModel(config, weights), GenStats()
    out = []
    t0 = time.perf_counter()
    for i, req in enumerate(requests):
        done, rng = Completion(req.prompt_ids), _rng(sampler, i)
        cache = model.new_cache(capacity=len(req.prompt_ids) + req.max_new_tokens)
        for pos, tok in enumerate(req.prompt_ids):
            logits = model.step(tok, pos, cache)
        while not done.finish:
            t1 = time.perf_counter()
            token = sampler.sample(logits, rng)
            done.tokens.append(token)
            done.finish = _finished(req, done, token)
            if on_token:
                on_token(i, token, done.finish)
            if not done.finish:
                logits = model.step(token, cache.length, cache)
                stats.token_latency_s.append(time.perf_counter() - t1)
        stats.tokens += len(done.tokens)
        out.append(done)
    stats.wall_s = time.perf_counter() - t0
    return out, stats


def pipeline_seconds(cycles: dict, n_stages: int, n_items: int, clock_hz: float) -> float:
    """Modelled time of one step: every stage region is its own hardware and takes the (micro-batches of)
    items in order, so item i leaves stage s at max(it left stage s-1, item i-1 left stage s) + its
    cycles at s."""
    done_prev = np.zeros(n_items)
    for s in range(n_stages):
        t = 0.0
        for i in range(n_items):
            t = max(t, done_prev[i]) + cycles.get((s, i), 0.0)
            done_prev[i] = t
    return float(done_prev.max(initial=0.0)) / clock_hz


@dataclass
class _Live:
    index: int
    req: GenRequest
    slot: int
    rng: np.random.Generator
    done: Completion
    pos: int = 0
    feed: tuple[int, ...] = ()  # tokens to push through the pipeline next step


class LocalDecoder:
    """The same tile programs without Ray: one thread per tile, queues as links (waferrt.loopfabric).
    For tests and for debugging a placement; WaferLLM is the real thing."""

    def __init__(self, config: LlamaConfig, weights, placement, algo: str = "ktree", k: int = 2):
        from .ledger import Ledger
        from .loopfabric import LoopFabric
        from .pipeline import TileProgram

        self.placement = placement
        self.setup = decode_setup(config, placement, algo, k)
        self.fabric = LoopFabric(placement.mesh)
        tiles = self.setup.stage_tiles()
        self.programs = {t: TileProgram(self.setup, t, self.fabric.links(t), Ledger(placement.spec))
                         for t in placement.mesh.tiles()}
        for s, arrays in packed_stages(self.setup, weights):
            self.programs[tiles[s]].load(s, arrays)
        self._steps = 0

    def _step(self, items: list, resets: list[int]) -> tuple[dict, float]:
        self._steps += 1

        def body(t, links):
            for slot in resets:
                self.programs[t].reset(slot)
            return self.programs[t].step(f"t{self._steps}", items)

        results = self.fabric.run_spmd(body)
        return _merge_results(list(results.values()), self.setup, self.placement.spec.clock_hz)

    def generate(self, requests: list[GenRequest], sampler: Sampler,
                 on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
        return continuous_batching(self._step, self.placement, requests, sampler, on_token)


def decode_setup(config: LlamaConfig, placement, algo: str, k: int) -> DecodeSetup:
    """What the tiles need to know of a Placement to run the decode."""
    return DecodeSetup(config, placement.mesh, placement.layers, placement.embed, placement.kv_tokens,
                       placement.kv.requests, algo, k, placement.dtype)


def packed_stages(setup: DecodeSetup, weights):
    """(stage index, its weight blocks in storage dtype) for every stage that holds weights."""
    from .decode_pack import pack_embed, pack_layer

    for s, (kind, layer, region) in enumerate(setup.stages()):
        if kind == "layer":
            yield s, pack_layer(setup.config, weights.layers[layer], region, setup.dtype)
        elif kind == "embed":
            yield s, pack_embed(setup.config, weights.embed, weights.final_norm, region, setup.dtype)


def _merge_results(results: list[dict], setup: DecodeSetup, clock_hz: float) -> tuple[dict, float]:
    logits, cycles = {}, {}
    for r in results:
        logits.update(r["logits"])
        cycles.update(r["cycles"])
    parts = max(r["parts"] for r in results)
    return logits, pipeline_seconds(cycles, len(setup.stages()), parts, clock_hz)


class WaferLLM:
    def __init__(self, config: LlamaConfig, weights, placement, address: str | None = None,
                 algo: str = "ktree", k: int = 2, timeout: float = 120.0):
        from .runtime import Wafer

        self.config, self.weights, self.placement = config, weights, placement
        self.setup = decode_setup(config, placement, algo, k)
        self.setup.stage_tiles()  # a placement the decode cannot run fails here, before Ray starts
        self.wafer = Wafer(placement.spec, placement.mesh, address=address, timeout=timeout)

    def __enter__(self) -> WaferLLM:
        return self if self.wafer.tiles else self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, progress: Callable[[str], None] | None = None) -> WaferLLM:
        say = progress or (lambda msg: None)
        mesh = self.placement.mesh
        say(f"starting {len(mesh.tiles())} tile actors for {mesh}")
        self.wafer.open(progress=lambda i, n: say(f"tile actors up: {i}/{n}"), node_ids=self._node_ids())
        try:
            self.wafer.on_every_tile("decode_setup", self.setup)
            self._load_weights(say)
        except BaseException:
            self.close()
            raise
        return self

    def _node_ids(self) -> dict:
        names = {name for _, name in self.placement.tile_nodes}
        return {} if len(names) <= 1 else dict(self.placement.tile_nodes)

    def _load_weights(self, say) -> None:
        tiles = self.setup.stage_tiles()
        n = sum(1 for kind, _, _ in self.setup.stages() if kind != "head")
        for i, (s, arrays) in enumerate(packed_stages(self.setup, self.weights)):
            self.wafer.call([(tiles[s], "decode_load", (s, arrays))])
            say(f"weights into core SRAM: {i + 1}/{n} regions")

    def close(self) -> None:
        self.wafer.close()

    def _step(self, items: list, resets: list[int]) -> tuple[dict, float]:
        results = self.wafer.on_every_tile("decode_step", self.wafer.next_epoch(), items, resets)
        return _merge_results(results, self.setup, self.placement.spec.clock_hz)

    def generate(self, requests: list[GenRequest], sampler: Sampler,
                 on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
        return continuous_batching(self._step, self.placement, requests, sampler, on_token)


def continuous_batching(step, placement, requests: list[GenRequest], sampler: Sampler,
                        on_token: OnToken | None = None) -> tuple[list[Completion], GenStats]:
    """Requests enter free KV slots as others finish (the scheduler's admission); every step pushes each
    live request's next tokens (its whole prompt, first) through `step(items, resets)`."""
    from .scheduler.admission import Admission, Request

    adm = Admission(placement.kv_tokens, placement.kv.requests)
    out = [Completion(r.prompt_ids) for r in requests]
    for i, r in enumerate(requests):
        refusal = adm.submit(Request(i, len(r.prompt_ids), r.max_new_tokens, frozenset(r.stop_ids)))
        if refusal:
            out[i].finish = f"refused: {refusal.reason}"
    free, live, resets, stats = list(range(placement.kv.requests)), {}, [], GenStats()
    t0 = time.perf_counter()
    while True:
        for a in adm.admit():
            live[a.rid] = _Live(a.rid, requests[a.rid], free.pop(0), _rng(sampler, a.rid), out[a.rid],
                                feed=requests[a.rid].prompt_ids)
        if not live:
            break
        items, owners = _items(live.values())
        t1 = time.perf_counter()
        logits, secs = step(items, resets)
        stats.steps, stats.modelled_s = stats.steps + 1, stats.modelled_s + secs
        if len(items) == len(live):  # a decode-only step: every request's next token
            stats.token_latency_s.append(time.perf_counter() - t1)
        resets = []
        for lv in _sample(owners, logits, sampler, on_token):  # the requests that just finished
            adm.finish(lv.index)
            free.append(lv.slot)
            resets.append(lv.slot)
            del live[lv.index]
    stats.wall_s = time.perf_counter() - t0
    stats.tokens = sum(len(c.tokens) for c in out)
    return out, stats


def _items(live) -> tuple[list, list]:
    """The step's items (slot, token, pos, want_logits): each live request's tokens to feed; and, per item,
    the request whose next token its logits give (None for the inner tokens of a prompt)."""
    items, owners = [], []
    for lv in live:
        for j, tok in enumerate(lv.feed):
            last = j == len(lv.feed) - 1
            items.append((lv.slot, tok, lv.pos + j, last))
            owners.append(lv if last else None)
    return items, owners


def _sample(owners, logits: dict, sampler: Sampler, on_token) -> list:
    """Sample each request's next token from its logits; returns the requests that are done."""
    done = []
    for i, lv in enumerate(owners):
        if lv is None:
            continue
        lv.pos += len(lv.feed)
        token = sampler.sample(logits[i], lv.rng)
        lv.done.tokens.append(token)
        lv.feed = (token,)
        lv.done.finish = _finished(lv.req, lv.done, token)
        if on_token:
            on_token(lv.index, token, lv.done.finish)
        if lv.done.finish:
            done.append(lv)
    return done
