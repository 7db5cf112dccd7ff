"""The bounds of an MoE layer's routed work: the parts of its cost that follow the tokens' routing.

Contract: pure closed forms over waferrt.decode.cost's MoE pieces. ``ROUTED`` names the parts of
``cost.moe_parts`` that follow the routing (the experts in their blocks, the dispatch, the combine);
``routed_alone_cycles`` is what the typical token's alone cycles at an MoE layer hold for them (the decode
program replaces it by the token's share of what ran: waferrt.decode.moe.MoEStep);
``cheapest_routed_cycles`` is the least any routing of a micro-batch can take there (a bound's MoE step:
scheduler.speed.moe_share_floor), ``cheapest_alltoall_cycles`` one token's cheapest dispatch and combine.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import alltoall_cost, total
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec

from .cost import Decoding, block_ffn_parts, moe_parts
from .linkload import AllToAll
from .moe_layout import expert_blocks

ROUTED = ("experts", "dispatch", "combine")  # the parts of moe_parts that follow the tokens' routing


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
