"""The same work on more tile actors: wall time per token and RSS per tile for 4, 8 and 16 tiles, side by side.

SmolLM2-135M at WSE-2, greedy, R requests of T new tokens. One placement -- the default mesh for the finest
cut (4x4 tiles: every region inside one tile, as the decode needs) -- is cut into 2x2, 4x2 and 4x4 tiles
(each coarser tile a union of finer ones, so every region stays inside one): the same cores hold the same
layers, weights and K/V, only the number of tile actors (Ray processes) that emulate them changes -- and
with it how many of the hand-overs between consecutive regions cross the fabric between processes instead
of staying inside one.
For each cut, in one run on one Ray with every cut's tile actors up at once and the cuts decoding in turn
(medians of the rounds): start-up (tile actors + weights into SRAM), per-token latency with 1 request in
flight, wall time per token with R in flight, peak RSS per tile (VmHWM; min / max, and beyond the tile's
own weights and K/V), the sum over the tiles, and the tokens and modelled tok/s (the same cores do the same
work, so both must not change with the cut).

    python benchmarks/tiles.py [--tokens 16] [--requests 4] [--cuts 2x2,4x2,4x4] [--rounds 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread per process, like the tiles

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from contextlib import ExitStack  # noqa: E402

import ray  # noqa: E402
from decode import peak_rss  # noqa: E402 - benchmarks/decode.py, next to this script

from waferrt.actors.tile import Tile  # noqa: E402
from waferrt.core.mesh import Extent, MeshSpec  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.decode.setup import DecodeSetup  # noqa: E402
from waferrt.llm import WaferLLM  # noqa: E402
from waferrt.model import Sampler, Tokenizer, load_model  # noqa: E402
from waferrt.runtime import ray_init  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan, violations  # noqa: E402
from waferrt.serving import GenRequest  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three laws of robotics",
           "Photosynthesis is the process"]
MB = 2**20


def recut(placement, cut: Extent):
    """The same placement (every region where it was) on the same mesh cut into `cut` (width x height) tiles."""
    m = placement.mesh
    mesh = MeshSpec(m.width, m.height, -(-m.width // cut.width), -(-m.height // cut.height))
    p = dataclasses.replace(placement, mesh=mesh, tile_nodes=tuple((t, "local") for t in sorted(mesh.tiles())))
    if bad := violations(p):
        raise SystemExit(f"{mesh}: {bad}")
    DecodeSetup.from_placement(p).stage_tiles()  # every region inside one tile, or PlacementError now
    return p


def measure(config, weights, placements: list, reqs: list[GenRequest], rounds: int) -> list[dict]:
    """Every cut's wafer open at once (started one after the other), then `rounds` rounds in which each
    decodes 1 request and then all of them, in turn: a load that drifts (the machine is shared) hits every
    cut alike. Medians over the rounds; peak RSS at the end."""
    greedy, runs = Sampler(), []
    with ExitStack() as stack:
        llms = []
        for p in placements:
            t0 = time.perf_counter()
            llms.append(stack.enter_context(WaferLLM(config, weights, p)))
            runs.append({"tiles": len(p.mesh.tiles()), "start_s": time.perf_counter() - t0, "lat": [], "per": []})
            llms[-1].generate(reqs[:1], greedy)  # warm-up: first touches of every array
        for _ in range(rounds):
            for llm, run in zip(llms, runs, strict=True):
                _, one = llm.generate(reqs[:1], greedy)
                got, many = llm.generate(reqs, greedy)
                run["lat"].append(sum(one.token_latency_s) / len(one.token_latency_s))
                run["per"].append(many.wall_s / many.tokens)
                run.update(modelled=many.wafer_tokens_per_s, tokens=[c.tokens for c in got])
        for llm, run in zip(llms, runs, strict=True):
            rss = [peak_rss(pid) for pid in llm.wafer.on_every_tile(Tile.pid)]
            held = llm.wafer.on_every_tile(Tile.decode_bytes)
            run.update(rss_min=min(rss), rss_max=max(rss), rss_sum=sum(rss),
                       extra_max=max(r - h for r, h in zip(rss, held, strict=True)),
                       latency_ms=1e3 * statistics.median(run["lat"]), ms_per_token=1e3 * statistics.median(run["per"]))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per request (16)")
    ap.add_argument("--requests", type=int, default=4, help="requests in flight for the batched run (4)")
    ap.add_argument("--cuts", default="2x2,4x2,4x4", help="tile cuts of the mesh, columns x rows (2x2,4x2,4x4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of decoding, every cut in turn (3)")
    args = ap.parse_args()
    cuts = [Extent(*(int(v) for v in c.split("x"))) for c in args.cuts.split(",")]
    config, weights, meta = load_model()
    tok = Tokenizer(meta)
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]
    kv = KVReserve(512, args.requests)
    finest = max(cuts, key=lambda c: c.cores)
    base = plan(config, WSE2, default_mesh(config, WSE2, kv, tiles=finest), kv=kv)
    ray_init(None)  # one Ray for every cut: the tile actors are what changes
    try:
        runs = measure(config, weights, [recut(base, c) for c in cuts], reqs, args.rounds)
    finally:
        ray.shutdown()
    _print(args, base.mesh, cuts, runs)


def _print(args, mesh, cuts, runs: list[dict]) -> None:
    first = runs[0]
    print(f"SmolLM2-135M on {mesh.width}x{mesh.height} {WSE2.name} cores, the same placement cut into more tiles; "
          f"greedy, {args.requests} requests x {args.tokens} new tokens\n")
    head = "| measure | " + " | ".join(f"{c} = {r['tiles']} tiles" for c, r in zip(cuts, runs)) + " |"
    print(head + "\n|" + " --- |" * (len(runs) + 1))
    rows = [("start: tile actors + weights into SRAM (s)", lambda r: f"{r['start_s']:.1f}"),
            ("per-token latency, 1 in flight (ms)", lambda r: f"{r['latency_ms']:.0f}"),
            (f"wall per token, {args.requests} in flight (ms)", lambda r: f"{r['ms_per_token']:.0f}"),
            ("  / the first cut's", lambda r: f"{r['ms_per_token'] / first['ms_per_token']:.2f}"),
            ("peak RSS per tile, min-max (MB)", lambda r: f"{r['rss_min'] / MB:.0f}-{r['rss_max'] / MB:.0f}"),
            ("  beyond its weights and K/V, max (MB)", lambda r: f"{r['extra_max'] / MB:.0f}"),
            ("peak RSS, all tiles (MB)", lambda r: f"{r['rss_sum'] / MB:.0f}"),
            ("  / the first cut's", lambda r: f"{r['rss_sum'] / first['rss_sum']:.2f}"),
            ("modelled tok/s (the same cores: must not change)", lambda r: f"{r['modelled']:,.0f}"),
            ("tokens = the first cut's", lambda r: "yes" if r["tokens"] == first["tokens"] else "NO")]
    for name, cell in rows:
        print(f"| {name} | " + " | ".join(cell(r) for r in runs) + " |")


if __name__ == "__main__":
    main()
