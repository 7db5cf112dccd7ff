"""CPU per generated token, in BLAS and outside it: the wafer's tiles in one process next to the anchor.

Load hides a wall-clock ratio; CPU seconds per token and the share of them spent outside BLAS it hides much
less. This runs, in ONE process with one BLAS thread, `--repeat` rounds of: the anchor (benchmarks/anchor.py)
decoding R requests together, then the wafer's tiles as threads (waferrt.serving.local.LocalDecoder: the
default placement of `waferrt generate`, every tile's decode loop, no Ray, no sockets) decoding the same
requests -- and counts each one's CPU seconds (time.process_time) and the CPU seconds inside
``decode.net.matmul_rows`` (every weight's BLAS call, the anchor's too; time.thread_time around each).
Prints per generated token: CPU ms, of it in BLAS and outside, medians (min-max) over the rounds; and the
tokens compared. Two idle cores running the wafer's two tiles side by side would make
2 x anchor CPU / wafer CPU of the anchor's speed, waits and memory contention aside.

    python benchmarks/overhead.py [--tokens 48] [--requests 8] [--repeat 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import anchor as anchor_module  # noqa: E402
from decode import PROMPTS, spread  # noqa: E402

import waferrt.decode.net as net  # noqa: E402
from waferrt.cli.placing import local_tiles  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.model import Sampler, Tokenizer, load_model  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan  # noqa: E402
from waferrt.serving import GenRequest  # noqa: E402
from waferrt.serving.local import LocalDecoder  # noqa: E402


class BlasClock:
    """CPU seconds spent inside matmul_rows, summed over the threads that call it."""

    def __init__(self):
        self.seconds, self.lock, self.inner = 0.0, threading.Lock(), net.matmul_rows

    def __call__(self, w, x):
        t0 = time.thread_time()
        out = self.inner(w, x)
        spent = time.thread_time() - t0
        with self.lock:
            self.seconds += spent
        return out


def measured(clock: BlasClock, run, tokens: int):
    """run() -> (its result, (CPU ms per token, of which in BLAS))."""
    clock.seconds, c0 = 0.0, time.process_time()
    got = run()
    return got, (1e3 * (time.process_time() - c0) / tokens, 1e3 * clock.seconds / tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    config, weights, meta = load_model()
    tok = Tokenizer(meta)
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]
    kv = KVReserve(512, args.requests)
    mesh = default_mesh(config, WSE2, kv).in_tiles(local_tiles())
    clock = BlasClock()
    net.matmul_rows = anchor_module.matmul_rows = clock  # the anchor's BLAS calls are the same function
    anchor = anchor_module.Anchor(config, weights)
    wafer = LocalDecoder(config, weights, plan(config, WSE2, mesh, kv=kv))
    wafer.generate(reqs[:1], Sampler())  # warm-up
    n, rows = len(reqs) * args.tokens, {"anchor": [], "wafer": []}
    for _ in range(args.repeat):
        (a_toks, _, _), a = measured(clock, lambda: anchor.generate(reqs), n)
        (done, _), w = measured(clock, lambda: wafer.generate(reqs, Sampler()), n)
        rows["anchor"].append(a)
        rows["wafer"].append(w)
        same = [c.tokens for c in done] == a_toks
        print(f"  round: CPU ms/token anchor {a[0]:.2f} ({a[1]:.2f} BLAS), wafer {w[0]:.2f} ({w[1]:.2f} BLAS); "
              f"same tokens: {same}")
    print(f"\n{len(reqs)} requests x {args.tokens} new tokens, wafer {mesh} as threads; per generated token, "
          f"median (min-max) of {args.repeat} rounds\n\n| CPU ms per token | anchor | wafer |\n| --- | --- | --- |")
    for name, pick in (("all", lambda r: r[0]), ("in BLAS (matmul_rows)", lambda r: r[1]),
                       ("outside BLAS", lambda r: r[0] - r[1])):
        print(f"| {name} | {spread([pick(r) for r in rows['anchor']])} | {spread([pick(r) for r in rows['wafer']])} |")
    share = [100 * (r[0] - r[1]) / r[0] for r in rows["wafer"]]
    ideal = [2 * a[0] / w[0] for a, w in zip(rows["anchor"], rows["wafer"], strict=True)]
    print(f"| wafer's share outside BLAS (%) | | {spread(share)} |")
    print(f"| 2 x anchor CPU / wafer CPU (two cores, no waits) | | {spread(ideal)} |")


if __name__ == "__main__":
    main()
