"""Decode speed: the wafer next to one plain numpy process, measured side by side in one run.

Prints, for SmolLM2-135M (greedy, R requests of T new tokens each):

- the numpy reference decoding one request at a time, and the same R requests *together* (batched steps:
  the weights read once per step for all of them) -- the honest anchor -- both with one BLAS thread;
- the wafer with 1 request in flight (per-token latency) and with R in flight (throughput, prefill included);
- the ratios against the goals: wafer R-in-flight / reference R-together (>= 1.0), wafer latency /
  reference latency (<= 1.5), modelled tok/s of what ran / the placement's bound (>= 0.9), Ray calls per
  generated token in steady state (0), peak RSS per tile beyond its share of the weights (<= 150 MB);
- with --ttft, the shell's time to the first token of `waferrt generate`, twice (the second run reads the
  dequantised-weights cache; goal <= 10 s).

    python benchmarks/decode.py [--tokens 32] [--requests 8] [--ttft]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the reference runs single-threaded, like a tile

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from waferrt.actors.tile import Tile  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.llm import WaferLLM  # noqa: E402
from waferrt.model import Sampler, Tokenizer, load_model  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan, plan_report  # noqa: E402
from waferrt.serving import GenRequest, generate_batched, generate_reference  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three laws of robotics",
           "Photosynthesis is the process", "A wafer-scale processor is", "The best way to learn Python",
           "In 1969, the first humans", "The recipe for a good soup"]


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def mean(xs) -> float:
    return sum(xs) / len(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per request (32)")
    ap.add_argument("--requests", type=int, default=8, help="requests in flight for the batched runs (8)")
    ap.add_argument("--ttft", action="store_true", help="also time `waferrt generate` to its first token, twice")
    args = ap.parse_args()
    config, weights, meta = load_model()
    tok, greedy = Tokenizer(meta), Sampler()
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]

    _, one_ref = generate_reference(config, weights, reqs[:2], greedy)
    _, many_ref = generate_batched(config, weights, reqs, greedy)
    ref_lat = mean(one_ref.token_latency_s)
    ref_many = many_ref.tokens / many_ref.wall_s
    print(f"reference, one request at a time:  {1 / ref_lat:7.1f} tok/s  {ref_lat * 1e3:6.1f} ms/token")
    print(f"reference, {args.requests} requests together:  {ref_many:7.1f} tok/s  (prefill included; "
          f"{ref_many * ref_lat:.2f}x one at a time)")

    kv = KVReserve(512, args.requests)
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    report = plan_report(placement)
    with WaferLLM(config, weights, placement) as llm:
        llm.generate(reqs[:1], greedy)  # warm-up: first touches of every array
        _, one = llm.generate(reqs[:1], greedy)
        calls0 = llm.ray_calls
        _, many = llm.generate(reqs, greedy)
        calls = llm.ray_calls - calls0
        _, longer = llm.generate([GenRequest(r.prompt_ids, 2 * args.tokens) for r in reqs], greedy)
        calls_longer = llm.ray_calls - calls0 - calls
        tiles = llm.wafer.tiles
        pids = dict(zip(tiles, llm.wafer.on_every_tile(Tile.pid), strict=True))
        held = dict(zip(tiles, llm.wafer.on_every_tile(Tile.decode_bytes), strict=True))
        rss = {t: peak_rss(pid) for t, pid in pids.items()}
    _print_wafer(args, (one, many), (ref_lat, ref_many), report)
    _print_calls(many.tokens, calls, calls_longer, longer.tokens)
    extra = {t: rss[t] - held[t] for t in tiles}
    print("peak RSS per tile (its weights + the rest): " + ", ".join(
        f"{t} {rss[t] / 2**20:.0f} MB ({held[t] / 2**20:.0f} + {extra[t] / 2**20:.0f})" for t in tiles)
        + f"; the rest at most {max(extra.values()) / 2**20:.0f} MB (goal <= 150 MB)")
    if args.ttft:
        for run in ("first", "second"):
            print(f"shell to first token, {run} run: {ttft():.1f} s (goal <= 10 s on the second)")


def _print_wafer(args, runs: tuple, refs: tuple[float, float], report) -> None:
    """The wafer's runs (1 in flight, args.requests in flight) against the reference's latency and rate and
    the placement's bound, ending in the table's first rows."""
    (one, many), (ref_lat, ref_many) = runs, refs
    lat = mean(one.token_latency_s)
    thr = many.tokens / many.wall_s
    bound_one, bound_many = report.bound_tokens_per_s(1), report.bound_tokens_per_s(args.requests)
    print(f"wafer, 1 in flight:                {1 / lat:7.1f} tok/s  {lat * 1e3:6.1f} ms/token")
    print(f"wafer, {args.requests} in flight:                {thr:7.1f} tok/s  (prefill included)")
    print(f"modelled {WSE2.name}, what ran vs the placement's bound: 1 in flight {one.wafer_tokens_per_s:,.0f} "
          f"vs {bound_one:,.0f} tok/s; {args.requests} in flight {many.wafer_tokens_per_s:,.0f} vs "
          f"{bound_many:,.0f} tok/s")
    print("\n| measure | this run | goal |\n| --- | --- | --- |")
    print(f"| wafer tok/s, {args.requests} in flight / the reference decoding them together | "
          f"{thr / ref_many:.2f} | >= 1.0 |")
    print(f"| wafer per-token latency, 1 request / the reference's | {lat / ref_lat:.2f} | <= 1.5 |")
    print(f"| modelled tok/s of what ran / the bound, {args.requests} in flight | "
          f"{many.wafer_tokens_per_s / bound_many:.2f} | >= 0.9 |")


def _print_calls(tokens: int, calls: int, calls_longer: int, tokens_longer: int) -> None:
    """The table's last row: Ray calls per token, from a run and a longer one."""
    print(f"| Ray calls per generated token in steady state | {(calls_longer - calls) / (tokens_longer - tokens):.3f} "
          f"({calls} calls for {tokens} tokens, {calls_longer} for {tokens_longer}) | 0 |")


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
