"""``waferrt plan``: show where a model sits on the emulated wafer, and how it re-plans around dead cores.

Contract: ``add_parser(subparsers)`` registers the ``plan`` subcommand;
``run(args) -> int`` prints the placement (text, or ``--json``), draws it with ``--png``, and with
``--dead N`` kills N random live cores, re-plans and prints both; ``--heatmap`` draws SRAM, modelled
link traffic and busy share over the mesh (waferrt.cli.heatmap). Exit status: 0 done, 1 the re-plan
failed (the reason is printed), 2 the model does not fit or an argument is wrong (the message says what
would work). ``--model smollm2`` uses the built-in SmolLM2-135M config; ``--model PATH`` reads only a
GGUF's metadata (``waferrt.model.gguf_loader.read_config``, imported only then), never its weights.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from waferrt.core.arith import cdiv
from waferrt.core.dtypes import STORAGE_DTYPES
from waferrt.core.mesh import Coord, Extent, Region
from waferrt.core.spec import PRESETS, spec_by_name
from waferrt.model.config import SMOLLM2_135M, LlamaConfig
from waferrt.scheduler import (
    KVReserve,
    NodeInfo,
    Placement,
    PlanError,
    PlanOptions,
    Replan,
    placement_to_json,
    plan_report,
    replan,
)

from .common import (
    MAX_REQUESTS,
    MAX_SEED,
    UsageError,
    add_max_tiles,
    check_max_tiles,
    checked_mesh,
    model_path,
    output_path,
    parse_wxh,
    png_path,
    whole_number,
)
from .draw import draw_png
from .model import searched_mesh
from .strategy import add_strategy_args, placed

MAX_NODES = 1024  # Ray nodes to plan over (more leaves nodes without a tile, and the search slow)
EPILOG = """examples:
  waferrt plan                          SmolLM2-135M on the default mesh (wse2, KV 512 tokens x 8 requests)
  waferrt plan --mesh 256x192 --tile 64x64 --nodes 2
  waferrt plan --dead 10 --png plan.png  kill 10 random cores, re-plan, draw both (+ plan-replan.png)
  waferrt plan --model path/to/model.gguf --spec wse3 --json > plan.json
  waferrt plan --kv-tokens 2048 --requests 2 --dtype float16
  waferrt plan --dead 10 --heatmap mesh.png   SRAM per core, modelled link traffic, busy per tile (of the re-plan)

Without --mesh the default mesh is used: the smallest 2x2 tiles that hold every region inside one tile
with spare layer slots for repair. Regions are rectangles of cores; [x0:x1)x[y0:y1) are core columns
and rows. Hops count the links a hand-over crosses between the nearest cores of two regions.
"""

def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help="place a model on the emulated wafer and print (or draw) the placement",
        description="Place a Llama model on the emulated wafer: layer -> region of cores, SRAM per core, "
                    "hops between consecutive layers, KV capacity, tile borders crossing Ray nodes, and "
                    "the modelled decode speed.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=model_path, default="smollm2",
                   help="'smollm2' (SmolLM2-135M, built in) or the path of a llama GGUF (metadata only)")
    p.add_argument("--mesh", type=parse_wxh, metavar="WxH", help="mesh size in cores (default: the default mesh)")
    p.add_argument("--tile", type=parse_wxh, metavar="TWxTH",
                   help="cores per tile (one Ray actor each); needs --mesh; default: 2x2 tiles")
    add_max_tiles(p)
    p.add_argument("--nodes", type=whole_number(1, "--nodes 2", MAX_NODES), default=1,
                   help="Ray nodes to spread the tiles over (default 1)")
    p.add_argument("--cpus", type=whole_number(1, "--cpus 2"), default=2, help="CPUs per Ray node (default 2)")
    p.add_argument("--spec", default="wse2", choices=sorted(PRESETS), help="hardware preset (default wse2)")
    p.add_argument("--kv-tokens", type=whole_number(1, "--kv-tokens 512"), default=512,
                   help="KV positions to reserve per request (512)")
    p.add_argument("--requests", type=whole_number(1, "--requests 8", MAX_REQUESTS), default=8,
                   help="requests in flight to reserve KV for (8)")
    p.add_argument("--dtype", default="float32", choices=STORAGE_DTYPES,
                   help="storage dtype of weights and KV (float32)")
    p.add_argument("--dead", type=whole_number(0, "--dead 10"), default=0, metavar="N",
                   help="kill N random live cores and re-plan")
    p.add_argument("--seed", type=whole_number(0, "--seed 3", MAX_SEED), default=0,
                   help="seed of the random dead cores (0)")
    p.add_argument("--png", type=png_path, metavar="PATH", help="draw the placement (and the re-plan) as PNG")
    p.add_argument("--heatmap", type=output_path("mesh.png"), metavar="PATH",
                   help="draw the mesh as a PNG: SRAM booked per core, modelled link traffic per core, modelled busy "
                        "share per tile, dead and spare cores (of the re-plan with --dead)")
    add_strategy_args(p)
    p.add_argument("--json", action="store_true", help="print the placement and report as JSON")
    p.set_defaults(_run=run)
    return p

def _model(name: str) -> tuple[LlamaConfig, str]:
    if name == "smollm2":
        return SMOLLM2_135M, "SmolLM2-135M"
    from waferrt.model.gguf_loader import read_config

    try:
        return read_config(name), Path(name).name
    except ValueError as e:  # not a (whole) GGUF, not a llama
        raise UsageError(f"cannot read --model: {e}") from None

def _kill(p: Placement, n: int, seed: int) -> frozenset[Coord]:
    m = p.mesh
    if n > m.width * m.height - len(m.dead):
        raise ValueError(f"--dead {n} is more than the {m.width * m.height - len(m.dead)} live cores")
    rng = random.Random(seed)
    live = (i for i in rng.sample(range(m.width * m.height), m.width * m.height)
            if Coord(i % m.width, i // m.width) not in m.dead)
    return frozenset(Coord(i % m.width, i // m.width) for _, i in zip(range(n), live, strict=False))

def _where(p: Placement, r: Region) -> tuple[str, str]:
    tiles = p.mesh.tiles_of(r)
    if len(tiles) == 1:
        return str(tiles[0]), p.node_of(tiles[0])
    return f"{len(tiles)} tiles from {tiles[0]}", ",".join(sorted({p.node_of(t) for t in tiles}))

def _table(p: Placement) -> str:
    rep = plan_report(p)
    rows = [f"{'region':12} {'cores':19} {'tile':14} {'node':8} {'KB/core':>8} {'hops->next':>10}"]
    layers = p.layer_regions()
    hops = (rep.embed_hops[0], *rep.hops, rep.embed_hops[1])  # embedding -> layer 0 ... last layer -> head
    named = [("embed", p.embed, rep.embed_core_bytes, hops[0])]
    named += [(name, r, rep.layer_core_bytes[k], hops[k + 1]) for k, (name, r) in enumerate(layers)]
    if p.head is not None:  # an untied head's own region: the chain ends there
        named.append(("head", p.head, rep.embed_core_bytes, "-"))
    for name, r, nbytes, hop in named:
        tile, node = _where(p, r)
        rows.append(f"{name:12} {str(r):19} {tile:14} {node:8} {nbytes / 1024:8.1f} {hop:>10}")
    return "\n".join(rows)

def _describe(p: Placement, model: str) -> str:
    c, s = p.config, p.spec
    nodes = ", ".join(f"{n.name} ({n.cpus} CPUs, {sum(1 for _, o in p.tile_nodes if o == n.name)} tiles)"
                      for n in p.nodes)
    return "\n".join([
        f"{model}: {c.n_layers} layers, dim {c.dim}, heads {c.n_heads}/{c.n_kv_heads}, hidden "
        f"{c.hidden_dim}, vocab {c.vocab_size}; spec {s.name} ({s.sram_bytes // 1024} KB/core), {p.dtype}",
        f"mesh {p.mesh}; Ray nodes: {nodes}", plan_report(p).text(), "", _table(p)])

def _replan_text(rp: Replan, dead: frozenset[Coord]) -> str:
    lines = [f"re-plan around {len(dead)} dead cores: {rp.mode}; broken: {', '.join(rp.broken) or 'nothing'};"
             f" moved: {', '.join(rp.moved) or 'nothing'}"]
    by_region: dict[str, list] = {}
    for m in rp.moves:
        by_region.setdefault("embed" if m.layer is None else f"layer {m.layer}", []).append(m)
    for name, ms in by_region.items():
        kv = sum(m.nbytes for m in ms if m.tensor == "kv")
        lines.append(f"  {name:12} {ms[0].src} -> {ms[0].dst}: {sum(m.nbytes for m in ms) - kv:,} weight bytes"
                     + (f" + {kv:,} KV bytes" if kv else ""))
    return "\n".join(lines + [plan_report(rp.placement).text()])

def _replan_json(dead: frozenset[Coord], rp: Replan | None, why: str) -> dict:
    out: dict = {"dead": [[c.x, c.y] for c in sorted(dead)]}
    if rp is None:
        return {**out, "error": why}
    moves = [{"tensor": m.tensor, "layer": m.layer, "src": [m.src.x0, m.src.y0, m.src.w, m.src.h],
              "dst": [m.dst.x0, m.dst.y0, m.dst.w, m.dst.h], "nbytes": m.nbytes} for m in rp.moves]
    return {**out, "mode": rp.mode, "broken": list(rp.broken), "moves": moves,
            "placement": placement_to_json(rp.placement), "report": plan_report(rp.placement).to_json()}

def _setup(args) -> tuple[Placement, str, frozenset[Coord], object]:
    mesh = checked_mesh(args, lambda size: Extent(cdiv(size.width, 2), cdiv(size.height, 2)))  # default: 2x2 tiles
    config, model = _model(args.model)
    spec = spec_by_name(args.spec)
    kv = KVReserve(args.kv_tokens, args.requests)
    names = [f"node{i}" for i in range(args.nodes)] if args.nodes > 1 else ["local"]
    nodes = tuple(NodeInfo(name, args.cpus) for name in names)
    p, choice = placed(args, config, spec, kv, nodes, lambda s: mesh or searched_mesh(
        config, spec, kv, PlanOptions(dtype=args.dtype, strategy=s)))
    check_max_tiles(args, p.mesh)
    return p, model, _kill(p, args.dead, args.seed) if args.dead else frozenset(), choice

def run(args) -> int:
    try:
        p, model, dead, choice = _setup(args)
    except ValueError as e:  # PlanError, UsageError, MeshTooLarge included
        print(f"waferrt plan: {e}", file=sys.stderr)
        return 2
    rp, why = None, ""
    if dead:
        try:
            rp = replan(p, dead)
        except PlanError as e:
            why = str(e)
    if args.json:
        doc = {"placement": placement_to_json(p), "report": plan_report(p).to_json()}
        if choice is not None:
            doc["strategy"] = {"why": choice.why, "candidates": [
                {"strategy": t.strategy.kind.value, "layers_per_region": t.strategy.group,
                 "mesh": str(t.placement.mesh), "latency_s": t.latency_s, "tokens_per_s": t.tokens_per_s}
                for t in choice.timed],
                "does_not_fit": [{"layers_per_region": s.group, "why": w} for s, w in choice.refused]}
        if dead:
            doc["replan"] = _replan_json(dead, rp, why)
        print(json.dumps(doc, indent=1))
    else:
        if choice is not None:
            print(f"strategy: {choice.why}\n{choice.table()}\n")
        print(_describe(p, model))
        if dead:
            print("\n" + (_replan_text(rp, dead) if rp else f"re-plan around {len(dead)} dead cores FAILED: "
                          f"{why}"))
    if args.png:
        paths = [draw_png(p, args.png)]
        if rp is not None:
            png = Path(args.png)
            paths.append(draw_png(rp.placement, png.with_name(png.stem + "-replan" + png.suffix), rp.moves))
        print("drew " + ", ".join(map(str, paths)), file=sys.stderr if args.json else sys.stdout)
    if args.heatmap:
        from waferrt.cli.heatmap import heatmap_png

        heatmap_png(rp.placement if rp is not None else p, args.heatmap)
        print(f"drew the heatmap {args.heatmap}", file=sys.stderr if args.json else sys.stdout)
    return 1 if why else 0
