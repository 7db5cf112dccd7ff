"""Decode speed: the wafer next to the fastest plain numpy process we could write, side by side in one run.

Prints, for SmolLM2-135M (greedy, R requests of T new tokens each, prompts of 5-9 tokens), ``--repeat``
rounds in which the anchor and the wafer run back to back, and the ratios' median and spread over them:

- the anchor (benchmarks/anchor.py: one process, one BLAS thread, float32 weights with q|k|v and gate|up
  fused, the R requests' tokens as one batched BLAS call per weight over 64-row panels, attention batched)
  decoding the R requests together, and one request alone; once, the anchor issue 18 describes ((in, out)
  weights, one x @ W per weight), to show this one is faster;
- the wafer with R requests in flight (tok/s, prefill included, like the anchor's) and 1 request (tok/s of
  its decode steps), each as a ratio of the anchor's (goals: >= 1.0 and >= 0.67);
- whether the tokens are the same, the modelled tok/s of what ran against its bound (>= 0.9; at the positions it held),
  Ray calls per generated token in steady state (0), peak RSS per tile beyond its share of the weights;
- the anchor and the tiles at the same niceness (Ray's workers default to 15; RAY_worker_niceness=0 here);
- with --ttft, the shell's time to the first token of `waferrt generate`, twice (the second run reads the
  dequantised-weights cache; goal <= 10 s).

    python benchmarks/decode.py [--tokens 48] [--requests 8] [--repeat 3] [--ttft] [--mesh WxH --tile TWxTH]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the anchor runs single-threaded, like a tile
os.environ.setdefault("RAY_worker_niceness", "0")  # Ray runs its workers at nice 15: on a shared machine the
# tiles would yield to every other process and the anchor (nice 0) would not; here both run at nice 0

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from anchor import Anchor  # noqa: E402

from waferrt.actors.tile import Tile  # noqa: E402
from waferrt.cli.placing import local_tiles  # noqa: E402
from waferrt.core.mesh import MeshSpec  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.llm import WaferLLM  # noqa: E402
from waferrt.model import Sampler, Tokenizer, load_model  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan, run_bound_tokens_per_s  # noqa: E402
from waferrt.serving import GenRequest, logit_positions, most_items  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three laws of robotics",
           "Photosynthesis is the process", "A wafer-scale processor is", "The best way to learn Python",
           "In 1969, the first humans", "The recipe for a good soup"]


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def mean(xs) -> float:
    return sum(xs) / len(xs)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def wxh(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    return int(w), int(h)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (48)")
    ap.add_argument("--requests", type=int, default=8, help="requests in flight for the batched runs (8)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of anchor-then-wafer (3)")
    ap.add_argument("--mesh", type=wxh, help="mesh WxH in cores (default: the planner's, in one tile per two "
                                             "cores of this machine, as `waferrt generate` runs it)")
    ap.add_argument("--tile", type=wxh, help="tile TWxTH in cores (with --mesh)")
    ap.add_argument("--ttft", action="store_true", help="also time `waferrt generate` to its first token, twice")
    args = ap.parse_args()
    config, weights, meta = load_model()
    tok = Tokenizer(meta)
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]
    anchor = Anchor(config, weights)
    kv = KVReserve(512, args.requests)
    mesh = MeshSpec(*args.mesh, *args.tile) if args.mesh else \
        default_mesh(config, WSE2, kv).in_tiles(local_tiles())  # as `waferrt generate` runs it
    placement = plan(config, WSE2, mesh, kv=kv)
    print(f"{len(reqs)} requests x {args.tokens} new tokens; wafer {mesh}")
    _, plain_wall, _ = Anchor(config, weights, panels=False).generate(reqs)
    _, panel_wall, _ = anchor.generate(reqs)
    print(f"anchor with panels {len(reqs) * args.tokens / panel_wall:.1f} tok/s, the issue's (in, out) x @ W "
          f"{len(reqs) * args.tokens / plain_wall:.1f} tok/s: {plain_wall / panel_wall:.2f}x")
    with WaferLLM(config, weights, placement) as llm:
        llm.generate(reqs[:1], Sampler())  # warm-up: first touches of every array
        rounds = [_round(anchor, llm, reqs) for _ in range(args.repeat)]
        calls0 = llm.ray_calls
        done, many = llm.generate(reqs, Sampler())
        calls = llm.ray_calls - calls0
        _, longer = llm.generate([GenRequest(r.prompt_ids, 2 * args.tokens) for r in reqs], Sampler())
        calls_longer = llm.ray_calls - calls0 - calls
        tiles = llm.wafer.tiles
        pids = dict(zip(tiles, llm.wafer.on_every_tile(Tile.pid), strict=True))
        held = dict(zip(tiles, llm.wafer.on_every_tile(Tile.decode_bytes), strict=True))
        rss = {t: peak_rss(pid) for t, pid in pids.items()}
    _print_ratios(args, rounds)
    bound = run_bound_tokens_per_s(placement, min(len(reqs), kv.requests), logit_positions(done), most_items(done))
    _print_rest(args, (many, bound), calls, (calls_longer, longer.tokens - many.tokens))
    extra = {t: rss[t] - held[t] for t in tiles}
    print("peak RSS per tile (its weights + the rest): " + ", ".join(
        f"{t} {rss[t] / 2**20:.0f} MB ({held[t] / 2**20:.0f} + {extra[t] / 2**20:.0f})" for t in tiles)
        + f"; the rest at most {max(extra.values()) / 2**20:.0f} MB (goal <= 150 MB)")
    if args.ttft:
        for run in ("first", "second"):
            print(f"shell to first token, {run} run: {ttft():.1f} s (goal <= 10 s on the second)")


def _round(anchor: Anchor, llm: WaferLLM, reqs: list[GenRequest]) -> dict:
    """One round, the anchor and the wafer back to back: tok/s of R together and of 1 alone, and whether
    their tokens agree."""
    a_toks, a_wall, _ = anchor.generate(reqs)
    done, many = llm.generate(reqs, Sampler())
    _, _, a_steps = anchor.generate(reqs[:1])
    _, one = llm.generate(reqs[:1], Sampler())
    r = {"anchor_many": sum(map(len, a_toks)) / a_wall, "wafer_many": many.tokens / many.wall_s,
         "anchor_one": 1 / mean(a_steps), "wafer_one": 1 / mean(one.token_latency_s),
         "same": [c.tokens for c in done] == a_toks}
    print(f"  round: anchor {r['anchor_many']:5.1f} / wafer {r['wafer_many']:5.1f} tok/s with {len(reqs)}; "
          f"anchor {r['anchor_one']:5.1f} / wafer {r['wafer_one']:5.1f} tok/s with 1; same tokens: {r['same']}")
    return r


def _print_ratios(args, rounds: list[dict]) -> None:
    many = [r["wafer_many"] / r["anchor_many"] for r in rounds]
    one = [r["wafer_one"] / r["anchor_one"] for r in rounds]
    same = all(r["same"] for r in rounds)
    print(f"\n| measure (median of {len(rounds)} rounds, min-max) | this run | goal |\n| --- | --- | --- |")
    print(f"| anchor, {args.requests} requests together (tok/s, prefill included) | "
          f"{spread([r['anchor_many'] for r in rounds])} | |")
    print(f"| wafer, {args.requests} in flight (tok/s, prefill included) | "
          f"{spread([r['wafer_many'] for r in rounds])} | |")
    print(f"| anchor, 1 request (tok/s) | {spread([r['anchor_one'] for r in rounds])} | |")
    print(f"| wafer, 1 request (tok/s) | {spread([r['wafer_one'] for r in rounds])} | |")
    print(f"| wafer / anchor, {args.requests} in flight | {spread(many)} | >= 1.0 |")
    print(f"| wafer / anchor, 1 request | {spread(one)} | >= 0.67 |")
    print(f"| the wafer's tokens = the anchor's | {'yes' if same else 'NO'} | yes |")


def _print_rest(args, ran: tuple, calls: int, longer: tuple[int, int]) -> None:
    many, bound = ran  # what ran, and its bound (scheduler.speed.run_bound_tokens_per_s: its own positions)
    calls_longer, more_tokens = longer
    print(f"| modelled {WSE2.name} tok/s of what ran / its bound, {args.requests} in flight | "
          f"{many.wafer_tokens_per_s:,.0f} / {bound:,.0f} = {many.wafer_tokens_per_s / bound:.2f} | >= 0.9 |")
    print(f"| Ray calls per generated token in steady state | {(calls_longer - calls) / more_tokens:.3f} "
          f"({calls} calls for {many.tokens} tokens, {calls_longer} for {many.tokens + more_tokens}) | 0 |")


def ttft() -> float:
    """Seconds from starting `waferrt generate "Hi" --max-new-tokens 1` to the first byte of its text."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "waferrt.cli", "generate", "Hi", "--max-new-tokens", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdout.read(1)
    first = time.perf_counter() - t0
    proc.communicate(timeout=300)
    return first


if __name__ == "__main__":
    main()
