"""An MoE decode's modelled time follows the tokens' real routing (no Ray): each step's busiest expert block,
its links as routed and NI-Balancer's migration (decode.moe.MoEStep) reach the schedule, so evening the blocks
under a skewed routing makes the modelled decode faster (MoEntwine's direction), and a typical token's step is
the closed forms' own."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode.balancer import Swap
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.moe import MoELayerShard, pack_moe_layer
from waferrt.decode.pack import Chunks
from waferrt.decode.routed_cost import cheapest_routed_cycles, routed_alone_cycles, routed_parts
from waferrt.model import Sampler, synthetic_llama, tiny_moe_config

CFG = tiny_moe_config(n_experts=4, top_k=2)  # dim 64, experts of width 32


def zero_router(weights):
    """Every token picks experts 0 and 1 (a zero router's ties go to the lowest): the most skewed routing."""
    return dataclasses.replace(weights, layers=[dataclasses.replace(lw, router=np.zeros_like(lw.router))
                                                for lw in weights.layers])


def shard_on(region: Region, mapping: str = "er") -> MoELayerShard:
    lw = zero_router(synthetic_llama(CFG, seed=2)).layers[0]
    return MoELayerShard(Decoding(CFG), region, pack_moe_layer(CFG, lw, region, mapping),
                         KVCapacity(3, 20), Ledger(TINY))


def step(shard: MoELayerShard, pos: int, batch: int = 3):
    x = np.random.default_rng(pos).standard_normal((batch, CFG.dim)).astype(np.float32)
    shard.forward(Chunks(CFG.dim, shard.region.w).split(x), np.arange(batch), np.full(batch, pos))
    return shard.step


def test_the_busiest_block_sets_a_steps_expert_compute_worked_out_by_hand():
    """A 1x2 region, ER: two one-core bands, experts 0 and 1 on the first, 2 and 3 on the second (no
    collective inside a one-core block: the experts are compute alone). One expert's SwiGLU per token is
    2*64*2*32 (w1, w3) + 5*32 (SiLU*u) + 2*32*64 (w2) = 8192 + 160 + 4096 = 12,448 flops. Three tokens all
    choosing experts 0 and 1: the first band runs both, 6 x 12,448 = 74,688 flops = 37,344 cycles at TINY's
    2 flops/cycle; after NI-Balancer swaps experts 1 and 2 each band runs one: 37,344 flops, 18,672 cycles."""
    shard = shard_on(Region(0, 0, 1, 2))
    before = step(shard, 0)
    assert before.experts.flops == 74_688 and before.experts.cycles == 37_344
    shard.migrate(Swap(1, 2))  # at once: the next step carries the stall
    after = step(shard, 1)
    assert after.experts.flops == 37_344 and after.experts.cycles == 18_672
    assert after.migration.cycles > 0 and before.migration.cycles == 0
    assert step(shard, 2).migration.cycles == 0  # the stall is paid once


def test_the_cheapest_routed_step_worked_out_by_hand():
    """The bound's MoE step (decode.routed_cost.cheapest_routed_cycles) on the 1x2 region above, three tokens: 3 x 2
    picks over two bands put at least 3 on the busiest, at best as one run: 3 x 12,448 flops = 18,672 cycles;
    ER's dispatch needs no hop, the cheapest combine is one token's from one band: one hop of its 64 float32
    (256 bytes) = 1 (alpha) + 8 (beta) + 256 / 4 (link bytes per cycle) = 73 cycles; 18,745 in all. The
    zero router's tokens (experts 0 and 1, both on band 0) take more; after NI-Balancer's swap (experts 0
    and 2 on the two bands) the experts reach the bound, and the combine of the three tokens is 128 cycles
    above one token's (its link carries 3 x 256 bytes: 1 + 8 + 768 / 4 = 201; the floor counts one token's
    routes, as tokens routed apart may share no link)."""
    floor = cheapest_routed_cycles(TINY, Decoding(CFG), Region(0, 0, 1, 2), 3)
    assert floor == 18_672 + 73
    shard = shard_on(Region(0, 0, 1, 2))
    skewed = step(shard, 0)
    assert skewed.routed.cycles > floor
    shard.migrate(Swap(1, 2))
    step(shard, 1)  # carries the stall
    even = step(shard, 2)
    assert even.experts.cycles == 18_672 and even.routed.cycles == floor + 201 - 73


@pytest.mark.parametrize("mapping", ["er", "naive"])
@pytest.mark.parametrize("w,h", [(1, 2), (2, 2), (2, 4)])
def test_the_cheapest_routed_step_is_no_dearer_than_any_routing(w, h, mapping):
    """cheapest_routed_cycles against every routing of a micro-batch (routed_parts, as MoELayerShard books what
    it ran): never above the cheapest, and equal to it for one token, whose floor every region here reaches."""
    dec, region = Decoding(CFG, experts=mapping), Region(0, 0, w, h)
    pairs = list(itertools.combinations(range(CFG.n_experts), CFG.top_k))
    for batch in (1, 2):
        best = min(sum(c.cycles for c in routed_parts(TINY, dec, region, np.array(chosen)))
                   for chosen in itertools.product(pairs, repeat=batch))
        floor = cheapest_routed_cycles(TINY, dec, region, batch)
        assert floor <= best and (batch > 1 or floor == best)


@pytest.mark.parametrize("mapping", ["er", "naive"])
def test_a_typical_tokens_step_is_the_closed_forms_routed_parts(mapping):
    """One token choosing experts 0..top_k-1 books what alone_cycles holds for its routed parts: the schedule's
    time for it is the closed forms' (the substitution changes nothing for the typical token)."""
    region = Region(0, 0, 8, 4)
    shard = shard_on(region, mapping)
    got = step(shard, 0, batch=1).share_cycles()
    assert got == pytest.approx(routed_alone_cycles(TINY, Decoding(CFG, experts=mapping), region), rel=1e-12)


def decode_seconds(balance: int) -> tuple[float, int, list]:
    from waferrt.scheduler import KVReserve, plan
    from waferrt.serving import GenRequest, LocalDecoder

    weights = zero_router(synthetic_llama(CFG, seed=5))
    placement = dataclasses.replace(plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(32, 4)), balance=balance)
    dec = LocalDecoder(CFG, weights, placement)
    requests = [GenRequest((5, 6, 7), 10), GenRequest((9,), 10), GenRequest((11, 2), 10), GenRequest((4,), 10)]
    got, stats = dec.generate(requests, Sampler())
    swaps = sum(len(sh.swaps) for p in dec.programs.values() for sh in p.layers.values())
    return stats.modelled_s, swaps, [c.tokens for c in got]


def test_ni_balancer_makes_a_skewed_decode_faster_in_the_modelled_time():
    """Under the most skewed routing (both chosen experts on one band), NI-Balancer's swaps -- their migration
    priced in the steps that carry it -- shorten the modelled decode; the tokens stay the same."""
    off, none, tokens_off = decode_seconds(0)
    on, swaps, tokens_on = decode_seconds(2)
    assert none == 0 < swaps and tokens_on == tokens_off
    assert on < 0.95 * off  # measured 18% faster (0.211 -> 0.173 ms)


def benchmark_layer():
    """One layer of the benchmark's shape (benchmarks/moe.py's phase part): SmolLM2-135M's dims cut into 64
    experts, top-8, on 32x16 cores of the WSE-2 model (synthetic weights: the costs do not read them)."""
    from waferrt.model.config import SMOLLM2_135M
    from waferrt.model.moe import ExpertCut, expert_config

    config = expert_config(dataclasses.replace(SMOLLM2_135M, n_layers=1, vocab_size=64), ExpertCut(64, 8))
    return config, synthetic_llama(config, seed=0).layers[0], Region(0, 0, 32, 16)


def phase(mapping: str, look: int, clustered: bool, steps: int) -> tuple[float, float, object]:
    """(compute, communication) cycles of the MoE phase summed over `steps` steps of 8 Zipf-routed tokens."""
    from waferrt.core.spec import WSE2
    from waferrt.decode.moe import run_steps

    config, lw, region = benchmark_layer()
    shard = MoELayerShard(Decoding(config, experts=mapping), region, pack_moe_layer(config, lw, region, mapping),
                          KVCapacity(8, steps), Ledger(WSE2))
    shard.balance = look
    shard.route_zipf(1.2, 0, clustered)
    xs = np.random.default_rng(0).standard_normal((steps, 8, config.dim)).astype(np.float32)
    runs = run_steps(shard, xs)
    return (sum(sum(s.compute_cycles(WSE2, "float32").values()) for s in runs),
            sum(sum(s.comm_cycles(WSE2, "float32").values()) for s in runs), shard)


def test_er_mapping_cuts_the_whole_moe_phases_communication_on_the_benchmarks_shape():
    """ER-Mapping's all-to-all saving shows in the whole phase's communication (router, experts' reductions,
    all-to-all), as benchmarks/moe.py prints it: measured -52% (MoEntwine: up to -62%)."""
    _, naive, n = phase("naive", 0, False, 1)
    _, er, e = phase("er", 0, False, 1)
    assert er < 0.6 * naive
    assert e.links.loads["moe"].hottest() < n.links.loads["moe"].hottest()


def test_ni_balancer_speeds_up_the_phase_when_the_hot_experts_share_a_band():
    """The hottest experts side by side on ER's first bands: NI-Balancer's swaps lower the busiest band's
    compute and the phase's communication (MoEntwine's direction: +54%, +22%)."""
    compute, comm, _ = phase("er", 0, True, 10)
    balanced, comm_balanced, shard = phase("er", 1, True, 10)
    assert len(shard.swaps) == 2  # in 10 steps: 1 of histogram, 4 of migration, twice
    assert balanced < 0.93 * compute and comm_balanced < comm  # measured 1.12x and 1.06x faster


def test_the_benchmark_prints_the_phase_table_beside_moentwines_figures():
    """benchmarks/moe.py --phase-only with every option of its second part, small: the three setups, the
    paper's figures and the why lines are printed."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "moe.py"
    proc = subprocess.run([sys.executable, str(script), "--phase-only", "--phase-moe", "16,2", "--zipf", "1.0",
                           "--batch", "2", "--steps", "2", "--look", "1", "--seed", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "MoEntwine (arXiv 2510.25258)" in out and out.count("ER vs naive: communication") == 2
    for line in ("naive ", "ER-Mapping ", "ER + NI-Balancer ", "why ER:", "why NI:", "why NI, measured:"):
        assert out.count(line) >= 2, line
