"""Decode throughput and latency: the wafer next to the single-process numpy reference, in one run.

Prints, side by side: reference tok/s (one BLAS thread, one process), wafer tok/s with 1 and with 8
requests in flight, per-token latency, the ratios (goals on a 2-core machine: 8 in flight >= 1.0x the
reference's throughput; 1 in flight <= 3x its latency), the modelled wafer tok/s, peak RSS per tile actor
and in total, and where the wall time goes (per tile: busy vs waiting on neighbours).

    python benchmarks/decode.py [--tokens 32] [--requests 8]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the reference runs single-threaded, like a tile

import argparse  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402

from waferrt.actors.tile import Tile  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, Tokenizer, load_gguf  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan  # noqa: E402
from waferrt.serving import GenRequest, generate_reference  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three laws of robotics",
           "Photosynthesis is the process", "A wafer-scale processor is", "The best way to learn Python",
           "In 1969, the first humans", "The recipe for a good soup"]


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return psutil.Process(pid).memory_info().rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per request (32)")
    ap.add_argument("--requests", type=int, default=8, help="requests in flight for the batched run (8)")
    args = ap.parse_args()
    config, weights, meta = load_gguf()
    tok = Tokenizer(meta)
    greedy = Sampler()
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]

    _, ref = generate_reference(config, weights, reqs[:2], greedy)
    ref_lat = sum(ref.token_latency_s) / len(ref.token_latency_s)
    print(f"reference (numpy, 1 thread): {1 / ref_lat:6.1f} tok/s   {ref_lat * 1e3:6.1f} ms/token")

    kv = KVReserve(512, args.requests)
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    with WaferLLM(config, weights, placement) as llm:
        llm.generate(reqs[:1], greedy)  # warm-up: first touches of every array
        _, one = llm.generate(reqs[:1], greedy)
        lat = sum(one.token_latency_s) / len(one.token_latency_s)
        t0 = time.perf_counter()
        _, many = llm.generate(reqs, greedy)
        busy = _profile(llm, reqs)
        rss = {str(t): peak_rss(p) for t, p in _pids(llm).items()}
    thr = many.tokens / (time.perf_counter() - t0)
    print(f"wafer, 1 in flight:           {1 / lat:6.1f} tok/s   {lat * 1e3:6.1f} ms/token   "
          f"latency {lat / ref_lat:.2f}x the reference (goal <= 3x)")
    print(f"wafer, {args.requests} in flight:           {thr:6.1f} tok/s   (prefill included)   "
          f"throughput {thr / (1 / ref_lat):.2f}x the reference (goal >= 1.0x)")
    print(f"modelled {WSE2.name}: {one.wafer_tokens_per_s:,.0f} tok/s with 1 in flight, "
          f"{many.wafer_tokens_per_s:,.0f} tok/s with {args.requests}")
    print("peak RSS per tile actor: " + ", ".join(f"{t} {b / 2**20:.0f} MB" for t, b in rss.items())
          + f"; total {sum(rss.values()) / 2**20:.0f} MB")
    print("where the time goes, one decode step of all requests (per tile: not waiting for a neighbour, "
          "CPU time, step wall):")
    for t, (b, c, w) in busy.items():
        print(f"  {t}: busy {b * 1e3:6.1f} ms, cpu {c * 1e3:6.1f} ms of {w * 1e3:6.1f} ms")


def _pids(llm) -> dict:
    return dict(zip(llm.wafer.tiles, llm.wafer.on_every_tile(Tile.pid), strict=True))


def _profile(llm, reqs) -> dict:
    """One step with every request's next token: each tile's compute time vs the step's wall time."""
    items = [(i, r.prompt_ids[0], 0, True) for i, r in enumerate(reqs)]
    t0 = time.perf_counter()
    res = llm.wafer.on_every_tile(Tile.decode_step, llm.wafer.next_epoch(), items, list(range(len(reqs))))
    wall = time.perf_counter() - t0
    return {str(t): (r.busy, r.cpu, wall) for t, r in zip(llm.wafer.tiles, res, strict=True)}


if __name__ == "__main__":
    main()
