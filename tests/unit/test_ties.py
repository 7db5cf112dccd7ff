"""The tying grid (issue 17): the estimator and the tiles agree, fact by fact, on a grid of models (the tiny
model, SmolLM2, a Llama3-8B-shaped config cut to 2 layers), storage dtypes (float32, float16), strategies
(layer, grouped, tensor, streaming) and region shapes (4x2, 8x4, 12x8 cores).

- bytes: the estimator's bytes per core (estimator.wafer / estimator.streaming, budget.embed_bytes) equal
  what every region's tiles book (decode.setup.stage_sram, from decode.layout);
- cycles: the estimator's time for one request's token (scheduler.speed.stage_seconds, as it times its
  floor plans) equals the cycles the tiles book: an emulated run for the tiny model (serving.LocalDecoder on a
  LoopFabric), and for every model the function the tile programs call per token (decode.cost.alone_cycles);
- streaming: the on-paper streaming estimate (estimator.streaming) against the streaming tiles.

Every case passes: the disagreements the grid found before the owners' refactor (a streaming region's double
buffer and scratch, the streaming step, the 16-bit compute rate) each have one owner now. Ray-free.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from waferrt.core.arith import cdiv
from waferrt.core.cost import total
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY, WSE2
from waferrt.core.topology import Topology
from waferrt.decode import layout as dl
from waferrt.decode.cost import alone_cycles, layer_decode_cost
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.schedule import round_seconds
from waferrt.decode.setup import DecodeSetup, stage_sram
from waferrt.decode.shards import LayerShard
from waferrt.decode.stage import StageKind, entries
from waferrt.decode.streaming import head_parts, stage_cycles, streamed_bytes
from waferrt.estimator import estimate as est
from waferrt.estimator import streaming as paper_streaming
from waferrt.estimator import wafer
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.model.sparse import DENSE, AttentionMode
from waferrt.model.zoo import MODELS as ZOO
from waferrt.scheduler import KVReserve, Placement, PlanOptions, Strategy, budget, plan, speed
from waferrt.scheduler.placement import plan_streaming, streaming_mesh
from waferrt.scheduler.types import Workload
from waferrt.serving import GenRequest, LocalDecoder

TINY_CFG = tiny_config()
MODELS = {"tiny": TINY_CFG, "smollm2": SMOLLM2_135M,
          "llama3-2l": dataclasses.replace(ZOO["llama3-8b"].config, n_layers=2)}
SPECS = {"tiny": TINY, "smollm2": WSE2, "llama3-2l": WSE2}
DTYPES = ("float32", "float16")
STRATEGIES = ("layer", "grouped", "tensor", "streaming")
SHAPES = ((4, 2), (8, 4), (12, 8))  # (cols, rows): legal for every model (tiny: head_dim 16 -> at most 8 rows)
KV = KVReserve(24, 2)  # 24 positions: a multiple of every shape's columns (see _context)

def _group(config, strategy: str) -> int | None:
    """Layers per region of a strategy (None: streaming; 0: the strategy does not apply to this model)."""
    return {"layer": 1, "tensor": config.n_layers, "streaming": None,
            "grouped": 2 if 2 < config.n_layers else 0}[strategy]


def _grid():
    """(model, dtype, strategy, shape) of the grid; grouped needs a model of more than 2 layers."""
    for model, dtype, strategy, shape in itertools.product(MODELS, DTYPES, STRATEGIES, SHAPES):
        if _group(MODELS[model], strategy) == 0:
            continue
        yield pytest.param(model, dtype, strategy, shape, id=f"{model}-{dtype}-{strategy}-{shape[0]}x{shape[1]}")


def _placement(model: str, dtype: str, strategy: str, shape: tuple[int, int]) -> Placement:
    """The grid point as a Placement (nothing about fitting in SRAM: the regions side by side on one row, the
    embedding first; streaming: one region for every stage)."""
    config, (w, h), g = MODELS[model], shape, _group(MODELS[model], strategy)
    if g is None:
        region = Region(0, 0, w, h)
        layers, embed, width = (region,) * config.n_layers, region, w
    else:
        layers = tuple(Region((1 + i // g) * w, 0, w, h) for i in range(config.n_layers))
        embed, width = Region(0, 0, w, h), (1 + cdiv(config.n_layers, g)) * w
    return Placement(config, SPECS[model], MeshSpec(width, h, width, h), dtype, KV, layers, embed, frozenset(), (),
                     KV.tokens, group=g or config.n_layers, streaming=g is None)


def _booked(setup: DecodeSetup) -> dict[Region, int]:
    """Bytes on the most loaded core of every region, summed over the stages that book on it (the tiles)."""
    per: dict[Region, np.ndarray] = {}
    for s in range(len(setup.stages())):
        for region, nbytes in stage_sram(setup, s).values():
            per[region] = per.get(region, 0) + nbytes
    return {region: int(np.max(nbytes)) for region, nbytes in per.items()}


@pytest.mark.parametrize("model,dtype,strategy,shape", _grid())
def test_the_estimators_bytes_per_core_are_what_the_tiles_book(model, dtype, strategy, shape):
    p = _placement(model, dtype, strategy, shape)
    config, booked, sh = p.config, _booked(DecodeSetup.from_placement(p)), wafer.Shape(*shape)
    if p.streaming:
        assert booked == {p.embed: paper_streaming._core_bytes(config, sh, KV.tokens, KV.requests, dtype)}
        return
    want = {p.embed: budget.embed_bytes(config, *shape, dtype)}
    for region in set(p.layers):
        layers = p.layers.count(region)
        want[region] = wafer.layer_core_bytes(Workload(config, KV, dtype, layers), sh)
    assert booked == want


def _context(p: Placement) -> int:
    """The K/V positions the timed token holds: a multiple of every layer region's columns, so the token at
    position context - 1 moves cols - 1 columns of its K/V, the estimator's full-reserve worst case."""
    return math.lcm(*(r.w for r in p.layers))


@pytest.mark.parametrize("model,dtype,strategy,shape",
                         [c for c in _grid() if c.values[2] != "streaming"])
def test_the_estimators_token_is_what_the_tile_programs_book(model, dtype, strategy, shape):
    """Every stage's cycles for one token alone, as TileProgram books them (decode.cost.alone_cycles: the
    hand-over from the previous stage's region included), sum to the estimator's time for that token."""
    p = _placement(model, dtype, strategy, shape)
    setup, ctx = DecodeSetup.from_placement(p), _context(p)
    stages = setup.stages()
    tiles = sum(alone_cycles(p.spec, setup.decoding, entry, ctx - 1, True) for entry in entries(stages))
    one, _ = speed.stage_seconds(p.spec, setup.decoding, stages, ctx, 1)
    assert one * p.spec.clock_hz == pytest.approx(tiles, rel=1e-12)


TINY_MESHES = (MeshSpec(16, 16, 8, 8), MeshSpec(24, 16, 8, 8), MeshSpec(32, 8, 16, 8))


def _tiny_placement(dtype: str, strategy: str, mesh: MeshSpec) -> Placement:
    if strategy == "streaming":
        small = streaming_mesh(TINY_CFG, TINY, KV, dtype)  # the one-tile mesh; wider tiles hold wider regions
        tile_w = small.tile_w * (1 + TINY_MESHES.index(mesh))
        return plan_streaming(TINY_CFG, TINY, MeshSpec(tile_w, small.height, tile_w, small.height), kv=KV,
                              options=PlanOptions(dtype=dtype))
    return plan(TINY_CFG, TINY, mesh, kv=KV,
                options=PlanOptions(dtype=dtype, strategy=Strategy(_group(TINY_CFG, strategy), 3)))


def _emulated_token(p: Placement, tokens: int) -> float:
    """Modelled seconds of the last round of one request decoding `tokens` tokens on the tiles (LoopFabric)."""
    dec = LocalDecoder(p.config, synthetic_llama(p.config, seed=0), p)
    _, stats = dec.generate([GenRequest((3,), tokens)], Sampler())
    return round_seconds(stats.runs, len(dec.setup.stages()) - 1, p.spec.clock_hz)


@pytest.mark.parametrize("dtype,strategy,mesh", itertools.product(DTYPES, STRATEGIES, TINY_MESHES))
def test_the_estimators_token_is_what_an_emulated_run_books(dtype, strategy, mesh):
    p = _tiny_placement(dtype, strategy, mesh)
    ctx = _context(p)
    assert speed.placement_seconds(p, 1, ctx)[0] == pytest.approx(_emulated_token(p, ctx), rel=1e-9)


TOPOLOGIES = {"mesh": TINY, "torus": TINY.replace(topology=Topology("torus")),  # no region line is a whole line
              # a wafer 16 cores wide: the head's region on TINY_MESHES[2] is 16 wide, its rows whole lines that wrap
              "torus-whole": TINY.replace(topology=Topology("torus"), full_mesh=(16, 64)),
              "mesh-switch": TINY.replace(topology=Topology("mesh-switch", 4))}  # a port every 4 cores of a line


def _recorded_token(p: Placement, tokens: int, attention: AttentionMode = DENSE) -> float:
    """Seconds the tiles' ledgers recorded (StageRun.cycles: what the layer's math did through
    waferrt.decode.net, not the closed forms the schedule reads) for the last token of one request decoding
    `tokens` tokens: every stage's run of it, one after the other."""
    dec = LocalDecoder(p.config, synthetic_llama(p.config, seed=0), p).use_attention(attention)
    _, stats = dec.generate([GenRequest((3,), tokens)], Sampler())
    runs = [r for r in stats.runs if any(it.pos == tokens - 1 for it in r.items)]
    assert {len(r.items) for r in runs} == {1} and len(runs) == len(dec.setup.stages())
    return sum(r.cycles for r in runs) / p.spec.clock_hz


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("dtype,strategy", itertools.product(DTYPES, ("layer", "grouped", "tensor")))
def test_the_estimators_token_is_what_the_tiles_recorded(topology, dtype, strategy):
    """The estimator's closed forms against what the emulated tiles recorded as their math ran, on every
    topology (the test above reads the closed forms the tiles' schedule is given; this one the ledgers)."""
    p = dataclasses.replace(_tiny_placement(dtype, strategy, TINY_MESHES[2]), spec=TOPOLOGIES[topology])
    ctx = _context(p)
    assert speed.placement_seconds(p, 1, ctx)[0] == pytest.approx(_recorded_token(p, ctx), rel=1e-9)


@pytest.mark.parametrize("topology", ["mesh", "mesh-switch"])
@pytest.mark.parametrize("strategy", ["layer", "grouped", "tensor"])
def test_the_estimators_sparse_token_is_what_the_tiles_recorded(topology, strategy):
    """The same under STAR's sparse attention keeping 4 keys of the 6-8 the last token sees (prediction, the
    row's top-K, the kept keys' attention): the closed forms (decode.cost.sparse_parts, in the stages' times)
    against the ledgers."""
    p = dataclasses.replace(_tiny_placement("float32", strategy, TINY_MESHES[2]), spec=TOPOLOGIES[topology])
    ctx, sparse = _context(p), AttentionMode.parse("sparse:4")
    dec = dataclasses.replace(DecodeSetup.from_placement(p), attention=sparse).decoding
    stages = DecodeSetup.from_placement(p).stages()
    assert sparse.keys_kept(ctx) < ctx
    one, _ = speed.stage_seconds(p.spec, dec, stages, ctx, 1)
    assert one == pytest.approx(_recorded_token(p, ctx, sparse), rel=1e-9)


def _tiles_streaming_token(p: Placement, ctx: int) -> float:
    """One request's token through a streaming region as its tiles book it: every stage lasts the longer of
    its compute (the closed forms the tiles book, tested above) and its block's stream (decode.streaming)."""
    spec, config, r, dtype = p.spec, p.config, p.embed, p.dtype
    dec = DecodeSetup.from_placement(p).decoding
    layer = layer_decode_cost(spec, dec, r, ctx, 1).cycles
    head = total(c for _, _, c in head_parts(spec, dec, r, 1)).cycles
    return (stage_cycles(spec, 0.0, streamed_bytes(config, StageKind.EMBED, dtype, 1))
            + config.n_layers * stage_cycles(spec, layer, streamed_bytes(config, StageKind.LAYER, dtype, 1))
            + stage_cycles(spec, head, streamed_bytes(config, StageKind.HEAD, dtype, 1))) / spec.clock_hz


@pytest.mark.parametrize("model,dtype,shape", itertools.product(MODELS, DTYPES, SHAPES))
def test_the_paper_streaming_estimate_is_what_the_streaming_tiles_book(model, dtype, shape):
    p = _placement(model, dtype, "streaming", shape)
    ctx = _context(p)
    dec = DecodeSetup.from_placement(p).decoding
    paper = paper_streaming._step_seconds(p.spec, dec, wafer.Shape(*shape), ctx, 1)
    wafer_only = paper - est.host_seconds(p.config, p.spec, 1)  # the tiles book no host exchange
    assert wafer_only == pytest.approx(_tiles_streaming_token(p, ctx), rel=1e-6)


def _layer_booked(dtype: str) -> float:
    """Cycles the tiles book for one token through one layer of the tiny model on a WSE-2 4x2 region."""
    region, ledger = Region(0, 0, 4, 2), Ledger(WSE2, dtype)  # the tiles' ledger computes at the storage dtype
    w = synthetic_llama(TINY_CFG, seed=0).layers[0]
    shard = LayerShard(Decoding(TINY_CFG, dtype), region, pack_layer(TINY_CFG, w, region, dtype),
                       KVCapacity(1, 8), ledger)
    x = Chunks(TINY_CFG.dim, 4).split(np.random.default_rng(0).standard_normal((1, TINY_CFG.dim)).astype(np.float32))
    shard.forward(x, np.arange(1), np.zeros(1, int))
    return ledger.by_op["layer"].cycles


def test_a_16_bit_decode_computes_at_the_16_bit_rate():
    """On a WSE-2 a float16 GEMV runs four FMACs a cycle (spec.half_flops_per_cycle): the tiles' layer and the
    estimator's token are faster in float16 than in float32."""
    assert _layer_booked("float16") < _layer_booked("float32")
    p16, p32 = (_placement("smollm2", d, "layer", (8, 4)) for d in ("float16", "float32"))
    assert speed.placement_seconds(p16, 1, 8)[0] < speed.placement_seconds(p32, 1, 8)[0]


def test_the_estimators_bytes_match_the_tiles_on_random_shapes():
    """Any legal region shape, K/V reserve, requests, layers stacked and dtype: the estimator's closed form
    (estimator.wafer) is the most loaded core of what the tiles book (decode.layout). Reports how many
    examples checked something (the others are shapes no layer can be cut over: assume())."""
    tried, checked = [], []

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(model=st.sampled_from(sorted(MODELS)), w=st.integers(1, 80), h=st.integers(1, 70),
           tokens=st.integers(1, 600), requests=st.integers(1, 4), layers=st.integers(1, 3),
           dtype=st.sampled_from(("float32", "float16", "bfloat16")))
    def prop(model, w, h, tokens, requests, layers, dtype):
        config = MODELS[model]
        tried.append(model)
        assume(layers <= config.n_layers)  # a Workload runs at most the model's layers on a region
        assume(wafer.legal(config, wafer.Shape(w, h), tokens))
        want = dl.most_bytes(dl.layer_booking(config, Region(0, 0, w, h), tokens, requests, dtype, layers))
        work = Workload(config, KVReserve(tokens, requests), dtype, layers)
        assert wafer.layer_core_bytes(work, wafer.Shape(w, h)) == want
        checked.append(model)

    prop()
    print(f"{len(checked)} of {len(tried)} examples checked a legal shape "
          f"({ {m: checked.count(m) for m in MODELS} }); the others were assumed away")
    assert len(checked) >= 50 and set(checked) == set(MODELS)
