"""Experts on the mesh: the link traffic of an MoE layer and of its attention, naive blocks vs ER-Mapping.

SmolLM2-MoE (SmolLM2-135M's FFNs cut into E experts, a seeded router choosing K per token; made in memory
as `waferrt convert --moe E,K` writes it) runs a prompt through one MoE layer (MoELayerShard, token by token
on the WSE-2 model) on two layer regions -- the planner's region for SmolLM2-MoE on WSE-2 (144x4) and a
square-ish 32x16 -- under both expert mappings. For each it prints, per token:

- the MoE phase (dispatch + combine, booked per link as they ran): bytes over the hottest link, the share of
  the region's links left cold, the all-to-all's modelled time (the ledger's booked cycles);
- the attention phase (its K-tree allreduces and K/V shift laid on the links, the closed forms the tiles
  book): hottest link, cold share, the collectives' time;
- how many tokens each expert received (the routing histogram, the same under every mapping), and what
  NI-Balancer would do with it: the swap of two experts that evens the blocks' loads, its cost moved at once
  (the decode stalls) vs in STEPS parts over the links the phases leave cold while decoding goes on.

    python benchmarks/moe.py [--moe 8,2] [--tokens 32] [--layer 0] [--png moe.png]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.balancer import at_once_cost, block_loads, plan_swap, step_cost
from waferrt.decode.cost import Decoding, layer_decode_parts
from waferrt.decode.linkload import LinkLoad
from waferrt.decode.moe import MoELayerShard, pack_moe_layer
from waferrt.decode.moe_layout import MAPPINGS, expert_grid
from waferrt.decode.pack import Chunks
from waferrt.decode.phases import attention_load
from waferrt.model import Tokenizer, load_model
from waferrt.model.moe import ExpertCut, cut_into_experts

PROMPT = ("A wafer-scale processor is a single chip as large as the silicon wafer it is made on: hundreds of "
          "thousands of small cores, each with its own memory, linked to their four neighbours.")
REGIONS = {"planned 144x4": Region(0, 0, 144, 4), "square 32x16": Region(0, 0, 32, 16)}
STEPS = 8


def balance(shard: MoELayerShard, attention: LinkLoad, tokens: int) -> str:
    """NI-Balancer on the shard's routing histogram: the swap, at once vs in STEPS parts (modelled)."""
    swap = plan_swap(shard.routed, shard.blocks)
    if swap is None:
        return "  NI-Balancer: the blocks are as even as a swap makes them"
    loads = block_loads(shard.routed, shard.blocks)
    moved = list(shard.blocks)
    moved[swap.a], moved[swap.b] = moved[swap.b], moved[swap.a]
    after = block_loads(shard.routed, tuple(moved))
    load, moe = shard.swap_traffic(swap), LinkLoad(shard.region)
    for phase in shard.traffic.values():
        moe.add(phase)
    moe.bytes /= tokens  # one token's MoE phase
    step = min((step_cost(WSE2, load, STEPS, busy) for busy in (moe, attention)), key=lambda c: c.cycles)
    once = at_once_cost(WSE2, load)
    return (f"  NI-Balancer: busiest block {max(loads.values())} -> {max(after.values())} tokens by swapping experts "
            f"{swap.a} and {swap.b} ({load.total() / 1e6:.2f} MB over the links): at once a "
            f"{once.cycles / WSE2.clock_hz * 1e6:.2f} us "
            f"stall; in {STEPS} steps +{step.cycles / WSE2.clock_hz * 1e6:.3f} us each while decoding goes on")


def run_layer(config, lw, region: Region, mapping: str, xs: np.ndarray) -> MoELayerShard:
    """The layer's shard on `region` under `mapping`, after the tokens xs (T, dim) went through it one by one."""
    shard = MoELayerShard(Decoding(config), region, pack_moe_layer(config, lw, region, mapping), (1, len(xs)), Ledger(WSE2))
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


def row(label: str, load: LinkLoad, tokens: int, seconds: float) -> str:
    return (f"  {label:<26} hottest link {load.hottest() / tokens:>9,.0f} B/token   cold links "
            f"{load.cold_share():>6.1%}   total {load.total() / tokens:>11,.0f} B/token   "
            f"time {seconds * 1e6:>7.3f} us/token")


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
    args = ap.parse_args()
    e, k = (int(v) for v in args.moe.split(","))
    t0 = time.perf_counter()
    dense_config, dense, meta = load_model()
    config, weights = cut_into_experts(dense_config, dense, ExpertCut(e, k, seed=0))
    ids = Tokenizer(meta).encode(PROMPT)[: args.tokens]
    xs = np.asarray(weights.embed[ids]) if args.layer == 0 else _hidden(config, weights, ids, args.layer)
    print(f"SmolLM2-MoE: {e} experts of width {config.hidden_dim}, top-{k}; layer {args.layer}, {len(ids)} tokens; "
          f"WSE-2 model ({WSE2.link_bytes_per_cycle:g} B/cycle per link, {WSE2.clock_hz / 1e9:g} GHz)\n")
    panels, hist = [], None
    for name, region in REGIONS.items():
        att = attention_load(WSE2, config, region, len(ids))
        print(f"{name} region ({region.w}x{region.h} cores, {region.size} cores)")
        print(row("attention (either mapping)", att, 1, attention_seconds(config, region, len(ids))))
        panels.append((f"{name}: attention", att.bytes.sum(axis=0)))
        alltoall = {}
        for mapping in MAPPINGS:
            shard = run_layer(config, weights.layers[args.layer], region, mapping, xs)
            g = expert_grid(e, region, mapping)
            moe = LinkLoad(region)
            for load in shard.traffic.values():
                moe.add(load)
            secs = sum(c.cycles for c in shard.booked.values()) / WSE2.clock_hz / len(ids)
            alltoall[mapping] = secs
            label = f"MoE {mapping} ({g.gx}x{g.gy} blocks)"
            print(row(label, moe, len(ids), secs))
            panels.append((f"{name}: {label}", moe.bytes.sum(axis=0) / len(ids)))
            hist = shard.routed
            if mapping == "er":
                balanced = balance(shard, att, len(ids))
        print(f"  all-to-all time naive / ER-Mapping: {alltoall['naive'] / max(alltoall['er'], 1e-30):.2f}x")
        print(balanced + "\n")
    print(f"routing histogram (tokens per expert, layer {args.layer}): {hist.tolist()}")
    if args.png:
        draw(args.png, panels)
        print(f"heatmap: {args.png}")
    print(f"({time.perf_counter() - t0:.1f}s)")


def _hidden(config, weights, ids, layer: int) -> np.ndarray:
    """The residual stream entering `layer` for every prompt token (the reference's prefill)."""
    from waferrt.model import KVCache
    from waferrt.model.reference import Layer, Rope, layer_prefill, rope_cos_sin

    cache = KVCache(config, len(ids))
    cos, sin = rope_cos_sin(np.arange(len(ids)), config.head_dim, config.rope_theta)
    x = np.asarray(weights.embed[ids])
    for i in range(layer):
        x = layer_prefill(x, Layer(weights.layers[i], config), cache.k[i], cache.v[i], Rope(np.arange(len(ids)), cos, sin))
    return x


if __name__ == "__main__":
    main()
