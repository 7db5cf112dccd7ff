"""An MoE layer's FFN on the modelled wafer: its closed forms, and the bounds of the work that follows its routing.

Contract: pure closed forms from waferrt.core.cost's primitives and decode.decoding's ``Decoding``, equal to
what decode.moe.MoELayerShard books (tests/unit/test_moe_mesh.py); decode.cost's ``layer_decode_parts``
adds ``moe_parts`` to an MoE layer. ``moe_parts`` prices the routing ``Decoding.routing`` names
(decode.decoding.Routing): FIRST, the typical token of a zero router (experts 0..top_k-1, what the emulator's
ties run), or EXPECTED, tokens routed uniformly at random (``uniform_routing``, seeded, the one owner of a
uniform router's picks): the experts (the busiest block) and the all-to-all averaged over sampled micro-batches
of the batch's size -- what the estimator and the heatmap price. ``routed_parts`` prices a given routing as
the MoE layer books what it ran (``expert_cost``: every expert's SwiGLU, decode.decoding.block_ffn_parts, in
its block; the dispatch and the combine: the routes of waferrt.decode.linkload.AllToAll).

``ROUTED`` names the parts of ``moe_parts`` that follow the routing (the experts in their blocks, the dispatch,
the combine); ``routed_alone_cycles`` is what the typical token's alone cycles at an MoE layer hold for them (the
decode program replaces it by the token's share of what ran: waferrt.decode.moe.MoEStep);
``cheapest_routed_cycles`` is the least any routing of a micro-batch can take there (a bound's MoE step:
scheduler.speed.moe_share_floor), ``cheapest_alltoall_cycles`` one token's cheapest dispatch and combine.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, alltoall_cost, mean, total
from waferrt.core.ledger import merge_parallel
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.model.config import LlamaConfig

from .decoding import Decoding, Routing, block_ffn_parts
from .linkload import AllToAll
from .moe_layout import expert_blocks

ROUTED = ("experts", "dispatch", "combine")  # the parts of moe_parts that follow the tokens' routing
ROUTING_SAMPLE = 16  # the fewest tokens Routing.EXPECTED's micro-batches hold in all
ROUTING_SEED = 0


def moe_parts(spec: HardwareSpec, dec: Decoding, region: Region, batch: int) -> list[tuple[str, str, Cost]]:
    """An MoE FFN's pieces for `batch` tokens routed as dec.routing says (module doc) on the expert mapping
    dec.experts (waferrt.decode.moe_layout): the router, the experts in their blocks side by side, the
    dispatch and the combine (the routes the tiles book, waferrt.decode.linkload.AllToAll)."""
    return list(_moe_parts(spec, dec, region.w, region.h, batch))


def uniform_routing(config: LlamaConfig, tokens: int, seed: int = ROUTING_SEED) -> np.ndarray:
    """(tokens, top_k) experts, each token's top_k distinct ones drawn uniformly at random (seeded): the one
    owner of a uniform router's picks (Routing.EXPECTED, estimator.moe_estimate's all-to-all sample)."""
    draws = np.random.default_rng(seed).random((tokens, config.n_experts))
    return np.argsort(draws, axis=1)[:, : config.top_k]


def routed_parts(spec: HardwareSpec, dec: Decoding, region: Region, chosen: np.ndarray) -> tuple[Cost, Cost, Cost]:
    """(experts, dispatch, combine) of a micro-batch whose tokens chose `chosen` (B, top_k), priced as
    decode.moe.MoELayerShard books what it ran (:func:`expert_cost`, the routes of the all-to-all)."""
    dispatch, combine = _routes(dec, region).phases(chosen)
    return expert_cost(spec, dec, region, chosen), alltoall_cost(spec, dispatch), alltoall_cost(spec, combine)


def expert_cost(spec: HardwareSpec, dec: Decoding, region: Region, chosen: np.ndarray) -> Cost:
    """The experts of a micro-batch whose tokens chose `chosen` (B, top_k), as MoELayerShard books them: every
    expert's SwiGLU for the tokens that chose it, one after another in its block, the blocks side by side."""
    blocks = expert_blocks(dec.config.n_experts, region, dec.experts)
    picks = np.bincount(np.asarray(chosen).ravel(), minlength=dec.config.n_experts)
    per_block: dict[Region, Cost] = {}
    for ex in np.nonzero(picks)[0]:
        blk = blocks[ex]
        per_block[blk] = per_block.get(blk, Cost()) + _expert_run(spec, dec, blk.w, blk.h, int(picks[ex]))
    return merge_parallel(list(per_block.values()))


def _routes(dec: Decoding, region: Region) -> AllToAll:
    return AllToAll.of(dec.config.dim, region, expert_blocks(dec.config.n_experts, region, dec.experts))


@lru_cache(maxsize=4096)
def _expert_run(spec: HardwareSpec, dec: Decoding, cols: int, rows: int, tokens: int) -> Cost:
    """One expert's SwiGLU for `tokens` tokens as MeshGEMVs in a cols x rows block (MoELayerShard._expert)."""
    return total([c for _, _, c in block_ffn_parts(spec, dec, cols, rows, dec.config.hidden_dim, tokens)])


@lru_cache(maxsize=4096)
def _moe_parts(spec: HardwareSpec, dec: Decoding, cols: int, rows: int, batch: int) -> tuple:
    """moe_parts on a cols x rows region (the same for every region of that shape). EXPECTED: routed_parts
    averaged over micro-batches of `batch` uniformly routed tokens, ROUTING_SAMPLE tokens or more in all."""
    config, region = dec.config, Region(0, 0, cols, rows)
    e, b, dim_c = config.n_experts, batch, cdiv(config.dim, region.w)
    if dec.routing is Routing.FIRST:
        routings = np.tile(np.arange(config.top_k), (1, b, 1))
    else:
        samples = cdiv(ROUTING_SAMPLE, b)
        routings = uniform_routing(config, samples * b).reshape(samples, b, config.top_k)
    priced = [routed_parts(spec, dec, region, chosen) for chosen in routings]
    experts, dispatch, combine = (mean(p[i] for p in priced) for i in range(3))
    return (("router", "gemv", dec.flops(spec, 2 * b * dim_c * e)),
            ("router.reduce", "allreduce", dec.line_reduce(spec, "x", region.w, 4 * b * e, region.h)),
            ("experts", "gemv", experts), ("dispatch", "alltoall", dispatch), ("combine", "alltoall", combine))


def routed_alone_cycles(spec: HardwareSpec, dec: Decoding, region: Region) -> float:
    """The cycles of the routed parts (ROUTED) of moe_parts for one typical token: what a token's alone
    cycles at an MoE layer hold for them, replaced by its share of what ran (waferrt.decode.moe.MoEStep)."""
    return sum(c.cycles for name, _, c in moe_parts(spec, dec, region, 1) if name in ROUTED)


def cheapest_routed_cycles(spec: HardwareSpec, dec: Decoding, region: Region, batch: int) -> float:
    """The fewest cycles the routed parts (ROUTED) of an MoE layer's run on a micro-batch of `batch` tokens take
    under any routing (what decode.moe.MoEStep.routed can be, NI-Balancer's migration aside: a bound's MoE step,
    where routed_alone_cycles is the typical token's). The busiest block runs at least cdiv(batch * top_k,
    blocks) of the tokens' expert picks, at best as one run on the cheapest shape of block (a run's cycles grow
    with its tokens, and two runs cost at least one run of their tokens together); the dispatch and the combine
    carry at least one token's routes (a phase's cost grows with its routes), at best to the fewest blocks its
    top_k distinct experts fit in (cheapest_alltoall_cycles)."""
    config = dec.config
    blocks = expert_blocks(config.n_experts, region, dec.experts)
    picks = cdiv(batch * config.top_k, len(set(blocks)))
    experts = min(total([c for _, _, c in block_ffn_parts(spec, dec, w, h, config.hidden_dim, picks)]).cycles
                  for w, h in {(b.w, b.h) for b in blocks})
    return experts + cheapest_alltoall_cycles(spec, dec, region.w, region.h)


@lru_cache(maxsize=256)
def cheapest_alltoall_cycles(spec: HardwareSpec, dec: Decoding, cols: int, rows: int) -> float:
    """The fewest cycles of one token's dispatch and combine on a cols x rows MoE region: over every set of the
    fewest blocks its top_k distinct experts can sit in (cdiv(top_k, experts per block); single blocks when
    there are more than CHEAPEST_SETS such sets: a set's routes hold a single block's)."""
    config, region = dec.config, Region(0, 0, cols, rows)
    blocks = expert_blocks(config.n_experts, region, dec.experts)
    first = {b: blocks.index(b) for b in blocks}  # each block by the first expert it holds
    fewest = cdiv(config.top_k, blocks.count(blocks[0]))
    if comb(len(first), fewest) > CHEAPEST_SETS:
        fewest = 1
    routes = AllToAll.of(config.dim, region, blocks)
    return min(sum(alltoall_cost(spec, load).cycles for load in routes.loads(np.array([chosen])))
               for chosen in combinations(sorted(first.values()), fewest))


CHEAPEST_SETS = 4096  # the most sets of blocks cheapest_alltoall_cycles routes one by one
