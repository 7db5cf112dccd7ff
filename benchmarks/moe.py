"""Experts on the mesh: the link traffic of an MoE layer and of its attention, naive blocks vs ER-Mapping.

SmolLM2-MoE (SmolLM2-135M's FFNs cut into E experts, a seeded router choosing K per token; made in memory
as `waferrt convert --moe E,K` writes it) runs a prompt through one MoE layer (MoELayerShard, token by token
on the WSE-2 model) on two layer regions -- a wide 144x4 (the planner's region for SmolLM2-MoE once) and a
square-ish 32x16 -- under both expert mappings. For each it prints, per token:

- the all-to-all (dispatch + combine, booked per link as they ran): bytes over the hottest link, the share of
  the region's links left cold, its modelled time (the ledger's booked cycles);
- the two phases of the layer as its collectives booked them on the links while it ran (decode.linkload.
  PhaseLinks): the attention phase (norms, QKV, attention, K/V shift, wo; its collectives' closed-form time)
  and the whole MoE phase (router, dispatch, experts, combine): hottest link, cold share; and the attention
  phase on paper (decode.phases.attention_load: the closed forms laid on the links), the same figures;
- how many tokens each expert received (the routing histogram, the same under every mapping), and what
  NI-Balancer would do with it: the swap of two experts that evens the blocks' loads, its cost moved at once
  (the decode stalls) vs in STEPS parts, each link's bytes during the phase that leaves it cold (here the
  phases over the whole run; the decode's MoELayerShard reads each micro-batch's own, which leave more cold).

Then the whole MoE phase under a skewed routing, on MoEntwine's kind of configuration (many fine-grained
experts, several on each band): SmolLM2-MoE --phase-moe E,K on a 32x16 region, --steps decode steps of --batch
tokens, every token routed by a seeded Zipf (--zipf, --seed; MoELayerShard.route_zipf) with the hot experts
scattered and then side by side; for naive, ER-Mapping and ER + NI-Balancer (looking every --look steps):
the phase's compute and communication per token by piece (router, the experts' reductions in their blocks,
the all-to-all, the migration), as every step booked it (decode.moe.MoEStep), its hottest link, the ratios
beside MoEntwine's figures, and why the modelled wafer gives what it gives. --phase-only prints only that.

    python benchmarks/moe.py [--moe 8,2] [--tokens 32] [--layer 0] [--png moe.png] [--phase-only]
        [--phase-moe 64,8] [--zipf 1.2] [--batch 32] [--steps 32] [--look 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.balancer import at_once_cost, block_loads, plan_swap, step_cost
from waferrt.decode.cost import layer_decode_parts
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.linkload import LinkLoad
from waferrt.decode.moe import BALANCE_STEPS, MoELayerShard, pack_moe_layer, run_steps
from waferrt.decode.moe_layout import MAPPINGS, expert_grid
from waferrt.decode.pack import Chunks
from waferrt.decode.phases import attention_load
from waferrt.model import Tokenizer, load_model
from waferrt.model.moe import ExpertCut, cut_into_experts

PROMPT = ("A wafer-scale processor is a single chip as large as the silicon wafer it is made on: hundreds of "
          "thousands of small cores, each with its own memory, linked to their four neighbours.")
REGIONS = {"wide 144x4": Region(0, 0, 144, 4), "square 32x16": Region(0, 0, 32, 16)}
STEPS = 8
PHASE_REGION = Region(0, 0, 32, 16)  # ER: 16 bands of 4 of the 64 experts (MoEntwine: several experts a die)


def balance(shard: MoELayerShard, tokens: int) -> str:
    """NI-Balancer on the shard's routing histogram: the swap, at once vs in STEPS parts (modelled)."""
    swap = plan_swap(shard.routed, shard.blocks)
    if swap is None:
        return "  NI-Balancer: the blocks are as even as a swap makes them"
    loads = block_loads(shard.routed, shard.blocks)
    moved = list(shard.blocks)
    moved[swap.a], moved[swap.b] = moved[swap.b], moved[swap.a]
    after = block_loads(shard.routed, tuple(moved))
    load = shard.swap_traffic(swap)
    phases = [per_token(phase, tokens) for phase in shard.links.loads.values()]  # measured as the layer ran
    step = step_cost(WSE2, load, STEPS, phases)
    once = at_once_cost(WSE2, load)
    return (f"  NI-Balancer: busiest block {max(loads.values())} -> {max(after.values())} tokens by swapping experts "
            f"{swap.a} and {swap.b} ({load.total() / 1e6:.2f} MB over the links): at once a "
            f"{once.cycles / WSE2.clock_hz * 1e6:.2f} us "
            f"stall; in {STEPS} steps +{step.cycles / WSE2.clock_hz * 1e6:.3f} us each while decoding goes on")


def run_layer(config, lw, region: Region, mapping: str, xs: np.ndarray) -> MoELayerShard:
    """The layer's shard on `region` under `mapping`, after the tokens xs (T, dim) went through it one by one."""
    packed = pack_moe_layer(config, lw, region, mapping)
    shard = MoELayerShard(Decoding(config), region, packed, KVCapacity(1, len(xs)), Ledger(WSE2))
    chunks = Chunks(config.dim, region.w)
    for pos, x in enumerate(xs):
        shard.forward(chunks.split(x[None]), np.array([0]), np.array([pos]))
    return shard


def attention_seconds(config, region: Region, tokens: int) -> float:
    """The attention's collectives for one token at a full context of `tokens` (closed forms, s)."""
    parts = layer_decode_parts(WSE2, Decoding(config), region, tokens, 1)
    attention = parts[: [p[0] for p in parts].index("residual") + 1]
    cycles = sum(c.cycles for _, cat, c in attention if cat in ("allreduce", "attention") and c.link_bytes)
    return cycles / WSE2.clock_hz


def attention_on_paper(config, region: Region, tokens: int) -> LinkLoad:
    """The attention phase of `tokens` tokens at positions 0.. laid on the links by the closed forms
    (decode.phases.attention_load; the K/V shift over the columns that move at each position)."""
    load = LinkLoad(region)
    for pos in range(tokens):
        load.add(attention_load(WSE2, config, region, pos + 1, moving=pos % region.w))
    return load


def per_token(load: LinkLoad, tokens: int) -> LinkLoad:
    out = LinkLoad(load.region)
    out.bytes = load.bytes / tokens
    return out


def row(label: str, load: LinkLoad, tokens: int, seconds: float | None = None) -> str:
    time_s = "" if seconds is None else f"   time {seconds * 1e6:>7.3f} us/token"
    return (f"  {label:<34} hottest link {load.hottest() / tokens:>9,.0f} B/token   cold links "
            f"{load.cold_share():>6.1%}   total {load.total() / tokens:>11,.0f} B/token{time_s}")


def draw(path: str, panels: list[tuple[str, np.ndarray]]) -> None:
    """Bytes each core sent per token (all four sides), one panel per (region, mapping, phase)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 2.2 * len(panels)))
    for i, (title, sent) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        im = ax.imshow(sent, aspect="auto", cmap="inferno", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, label="bytes sent per token")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moe", default="8,2", help="E,K: experts per layer, used per token (8,2)")
    ap.add_argument("--tokens", type=int, default=32, help="prompt tokens run through the layer (32)")
    ap.add_argument("--layer", type=int, default=0, help="which layer (0)")
    ap.add_argument("--png", help="draw the per-core traffic of every phase")
    ap.add_argument("--phase-only", action="store_true", help="only the whole MoE phase under a skewed routing")
    ap.add_argument("--phase-moe", default="64,8", help="E,K of the skewed-routing part (64,8)")
    ap.add_argument("--zipf", type=float, default=1.2, help="the routing's Zipf exponent (1.2)")
    ap.add_argument("--batch", type=int, default=32, help="tokens per decode step (32)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps (32)")
    ap.add_argument("--look", type=int, default=4, help="NI-Balancer looks at its histogram every N steps (4)")
    ap.add_argument("--seed", type=int, default=0, help="the routing's seed (0)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    dense_config, dense, meta = load_model()
    if not args.phase_only:
        links_part(args, (dense_config, dense, meta))
    phase_part(args, dense_config, dense)
    print(f"({time.perf_counter() - t0:.1f}s)")


def links_part(args, model) -> None:
    """Per token, an MoE layer's all-to-all and its phases' links, naive vs ER, on REGIONS (module docstring)."""
    dense_config, dense, meta = model
    e, k = (int(v) for v in args.moe.split(","))
    config, weights = cut_into_experts(dense_config, dense, ExpertCut(e, k, seed=0))
    ids = Tokenizer(meta).encode(PROMPT)[: args.tokens]
    xs = np.asarray(weights.embed[ids]) if args.layer == 0 else _hidden(config, weights, ids, args.layer)
    print(f"SmolLM2-MoE: {e} experts of width {config.hidden_dim}, top-{k}; layer {args.layer}, {len(ids)} tokens; "
          f"WSE-2 model ({WSE2.link_bytes_per_cycle:g} B/cycle per link, {WSE2.clock_hz / 1e9:g} GHz)\n")
    panels, hist = [], None
    for name, region in REGIONS.items():
        print(f"{name} region ({region.w}x{region.h} cores, {region.size} cores)")
        alltoall = {}
        for mapping in MAPPINGS:
            shard = run_layer(config, weights.layers[args.layer], region, mapping, xs)
            g = expert_grid(e, region, mapping)
            moe = LinkLoad(region)
            for load in shard.traffic.values():
                moe.add(load)
            secs = sum(c.cycles for c in shard.booked.values()) / WSE2.clock_hz / len(ids)
            alltoall[mapping] = secs
            label = f"{mapping} ({g.gx}x{g.gy} blocks)"
            att, phase = shard.links.loads["attention"], shard.links.loads["moe"]
            print(row(f"all-to-all {label}", moe, len(ids), secs))
            print(row("  attention phase, measured", att, len(ids), attention_seconds(config, region, len(ids))))
            if mapping == MAPPINGS[0]:
                print(row("  attention phase, on paper", attention_on_paper(config, region, len(ids)), len(ids)))
            print(row("  MoE phase (all of it), measured", phase, len(ids)))
            for title, load in ((f"attention phase ({mapping})", att), (f"MoE phase {label}", phase)):
                panels.append((f"{name}: {title}, measured", load.bytes.sum(axis=0) / len(ids)))
            hist = shard.routed
            if mapping == "er":
                balanced = balance(shard, len(ids))
        print(f"  all-to-all time naive / ER-Mapping: {alltoall['naive'] / max(alltoall['er'], 1e-30):.2f}x")
        print(balanced + "\n")
    print(f"routing histogram (tokens per expert, layer {args.layer}): {hist.tolist()}\n")
    if args.png:
        draw(args.png, panels)
        print(f"heatmap: {args.png}")


def phase_part(args, dense_config, dense) -> None:
    """The whole MoE phase per token under a seeded Zipf routing, naive / ER / ER + NI-Balancer, with the hot
    experts scattered (a seeded shuffle) and side by side (the hottest in one band: NI-Balancer's case)."""
    e, k = (int(v) for v in args.phase_moe.split(","))
    config, weights = cut_into_experts(dense_config, dense, ExpertCut(e, k, seed=0))
    print(f"The whole MoE phase under a skewed routing: SmolLM2-MoE {e} experts of width {config.hidden_dim}, "
          f"top-{k} (fine-grained, as the DeepSeek/Qwen MoEs MoEntwine serves), layer 0 on {PHASE_REGION.w}x"
          f"{PHASE_REGION.h} cores; {args.steps} decode steps of {args.batch} tokens, Zipf s={args.zipf}, seed "
          f"{args.seed}; NI-Balancer looks every {args.look} steps\n{MOENTWINE}")
    for clustered in (False, True):
        where = "side by side (ranks in expert order)" if clustered else "scattered (a seeded shuffle)"
        print(f"\nhot experts {where}")
        args.clustered = clustered
        phase_table(config, weights.layers[0], PHASE_REGION, args)

# -- the whole MoE phase under a skewed routing: naive, ER-Mapping, ER + NI-Balancer --------------------------
MOENTWINE = ("MoEntwine (arXiv 2510.25258): ER-Mapping up to 62% less communication; NI-Balancer +54% MoE compute, "
             "+22% communication")
SETUPS = (("naive", "naive", 0), ("ER-Mapping", "er", 0), ("ER + NI-Balancer", "er", 1))  # name, mapping, balance?


def phase_run(config, lw, region: Region, setup: tuple[str, str, int], args, placed: tuple = ()) -> dict:
    """The MoE layer on `region` over args.steps decode steps of args.batch tokens, every token routed by a
    seeded Zipf (MoELayerShard.route_zipf): the MoE phase's compute and communication per token by piece (what
    each step booked, decode.moe.MoEStep), and its hottest link per token (PhaseLinks, as recorded). `placed`:
    swaps made at once before the first step (their stall in its migration)."""
    _, mapping, balance = setup
    shard = MoELayerShard(Decoding(config, experts=mapping), region, pack_moe_layer(config, lw, region, mapping),
                          KVCapacity(args.batch, args.steps), Ledger(WSE2))
    for swap in placed:
        shard.migrate(swap)
    shard.balance = args.look if balance else 0
    shard.route_zipf(args.zipf, args.seed, args.clustered)
    xs = np.random.default_rng(args.seed).standard_normal((args.steps, args.batch, config.dim)).astype(np.float32)
    out = {}
    for step in run_steps(shard, xs):
        parts = (("compute", step.compute_cycles(WSE2, "float32")), ("comm", step.comm_cycles(WSE2, "float32")))
        for kind, part in parts:
            for name, cycles in part.items():
                out[f"{kind}.{name}"] = out.get(f"{kind}.{name}", 0.0) + cycles
    tokens = args.batch * args.steps
    out = {k: v / tokens / WSE2.clock_hz * 1e6 for k, v in out.items()}  # us per token
    out["hottest"] = shard.links.loads["moe"].hottest() / tokens
    out["swaps"] = tuple(shard.swaps)
    out["busiest"] = max(block_loads(shard.routed, shard.blocks).values()) / tokens
    bands = len(set(shard.blocks))  # no placement's busiest block carries less than the hottest expert or a fair share
    out["floor"] = max(shard.routed.max(), shard.routed.sum() / bands) / tokens
    return out


def total(run: dict, kind: str) -> float:
    return sum(v for k, v in run.items() if k.startswith(kind + "."))


def phase_table(config, lw, region: Region, args) -> dict[str, dict]:
    """Print the three setups side by side with MoEntwine's figures and what the modelled wafer says why."""
    runs = {setup[0]: phase_run(config, lw, region, setup, args) for setup in SETUPS}
    print(f"{'':<18}{'compute':>9}{'comm':>9}{'= router':>10}{'experts':>9}{'all-to-all':>11}{'migration':>10}"
          f"{'hottest link':>14}  (us/token; B/token)")
    for name, r in runs.items():
        print(f"{name:<18}{total(r, 'compute'):>9.4f}{total(r, 'comm'):>9.4f}{r['comm.router']:>10.4f}"
              f"{r['comm.experts']:>9.4f}{r['comm.alltoall']:>11.4f}{r['comm.migration']:>10.4f}"
              f"{r['hottest']:>14,.0f}  swaps {len(r['swaps'])}")
    naive, er, ni = (runs[s[0]] for s in SETUPS)
    print(f"  ER vs naive: communication {total(er, 'comm') / total(naive, 'comm') - 1:+.0%} "
          f"(all-to-all {er['comm.alltoall'] / naive['comm.alltoall'] - 1:+.0%}; MoEntwine: up to -62%)")
    print(f"  NI-Balancer on ER: compute {total(er, 'compute') / total(ni, 'compute') - 1:+.0%} (the experts' "
          f"{er['compute.experts'] / ni['compute.experts'] - 1:+.0%}), communication "
          f"{total(er, 'comm') / total(ni, 'comm') - 1:+.0%} (speed-ups; MoEntwine: +54%, +22%); the phase's modelled "
          f"time {total(er, 'compute') + total(er, 'comm'):.3f} -> "
          f"{total(ni, 'compute') + total(ni, 'comm'):.3f} us/token")
    placed = phase_run(config, lw, region, SETUPS[1], args, ni["swaps"])  # its final placement from the start
    why(naive, er, ni, args.look)
    print(f"  why NI, measured: the experts' compute is {er['compute.experts'] / ni['compute.experts'] - 1:+.0%} as it "
          f"ran and {er['compute.experts'] / placed['compute.experts'] - 1:+.0%} on NI-Balancer's final placement from "
          f"the first step (its swaps land one by one); the router's compute, the same in every setup, is "
          f"{er['compute.router'] / total(er, 'compute'):.0%} of ER's")
    return runs


def why(naive: dict, er: dict, ni: dict, look: int) -> None:
    """What the numbers say about why the modelled wafer gives the figures it gives (measured, this run)."""
    a2a = naive["comm.alltoall"] / total(naive, "comm")
    inside = (er["comm.router"] + er["comm.experts"]) / total(er, "comm")
    print(f"  why ER: the all-to-all is {a2a:.0%} of naive's communication and ER removes "
          f"{1 - er['comm.alltoall'] / naive['comm.alltoall']:.0%} of it; {inside:.0%} of ER's is the router's row "
          f"reduction and the experts' reductions inside their blocks, which MoEntwine's dies do not have (there an "
          f"expert computes on one die: the phase's communication is its all-to-all)")
    print(f"  why NI: for this run's routing the busiest band carries {er['busiest']:.2f} expert-tokens per token on "
          f"ER's placement, {ni['busiest']:.2f} on the one NI-Balancer ended with (none goes below {ni['floor']:.2f}: "
          f"the hottest expert alone, or an even share); "
          f"{len(ni['swaps'])} swaps, each after {look} steps of histogram and {BALANCE_STEPS} of migration, migration "
          f"{ni['comm.migration']:.4f} us/token (nothing on a link the attention or the MoE phase leaves cold)")

def _hidden(config, weights, ids, layer: int) -> np.ndarray:
    """The residual stream entering `layer` for every prompt token (the reference's prefill)."""
    from waferrt.model import KVCache
    from waferrt.model.reference import Layer, Rope, layer_prefill, rope_cos_sin

    cache = KVCache(config, len(ids))
    cos, sin = rope_cos_sin(np.arange(len(ids)), config.head_dim, config.rope_theta)
    x = np.asarray(weights.embed[ids])
    for i in range(layer):
        rope = Rope(np.arange(len(ids)), cos, sin)
        x = layer_prefill(x, Layer(weights.layers[i], config), cache.k[i], cache.v[i], rope)
    return x


if __name__ == "__main__":
    main()
