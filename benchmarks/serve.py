"""Serving against offline, in one run: ``waferrt bench``'s load through ``waferrt serve``, the same requests
through ``waferrt generate`` (the engine directly, the same model and placement), and the load again under
seeded faults (``waferrt serve --chaos``).

    python benchmarks/serve.py                                   # SmolLM2 on its default mesh, 16 requests
    python benchmarks/serve.py --wafer "--model t.gguf --spec tiny --mesh 16x16 --tile 8x8 --kv-tokens 64"
    python benchmarks/serve.py --num-prompts 8 --output-len 8 --chaos 7:3 --markdown

It takes every option of ``waferrt bench`` (the load: prompts drawn with the model's tokenizer, arrivals,
concurrency, SLOs) and ``--wafer "FLAGS"``, the model and placement flags given to both ``waferrt serve`` and
``waferrt generate``. Requests do not ignore EOS here (``generate`` stops at it), and every request asks for
``--output-len`` tokens (``--range-ratio`` spreads the prompts only), so both sides decode the same tokens:
the texts are compared. Steps, one at a time (this machine has 2 cores): (1) a server, the load, the server
stopped; (2) ``generate --json`` on the same prompts: offline output tokens per second of its decode; (3) a
server with ``--chaos SEED:N``, the same load: requests lost (failed), texts that differ from (1), faults
recovered (its /metrics). ``--rounds N`` repeats (1) and (2) N times and reports the median round (the load of
a shared machine moves between the two). Prints the bench table of each load, then the summary
(``--markdown``: the README's table) with serving/offline output throughput (the goal: >= 0.8).
``--save-result PATH``: all of it as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

import httpx

from waferrt.cli import bench
from waferrt.cli.loadgen import Plan, Prompt, Target, run_load
from waferrt.serving.stats import summarize
from waferrt.serving.workload import Arrivals
from waferrt.testing.served import serving

GENERATE_DEADLINE_S = 1800.0


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_options(ap)
    ap.set_defaults(num_prompts=16, input_len=24, output_len=24)
    ap.add_argument("--wafer", default="", metavar='"FLAGS"', help="model and placement flags of serve and generate")
    ap.add_argument("--chaos", default="7:3", metavar="SEED[:N]", help="the faulted run's --chaos (default 7:3)")
    ap.add_argument("--no-chaos", action="store_true", help="leave the faulted run out")
    ap.add_argument("--rounds", type=int, default=1, help="serving then offline, this many times (the ratio's "
                                                           "median and spread: the machine's load moves)")
    ap.add_argument("--markdown", action="store_true", help="the summary as the README's table")
    args = ap.parse_args()
    wafer = shlex.split(args.wafer)
    if "--model" in wafer:
        args.model = wafer[wafer.index("--model") + 1]
    return args


def _load(args, url: str, prompts: tuple) -> tuple:
    """The bench's load against the server at `url`: (its Run, its Summary, /metrics after it)."""
    offsets = Arrivals(args.request_rate, args.burstiness).offsets(len(prompts), args.seed)
    plan = Plan(prompts, tuple(float(t) for t in offsets), args.max_concurrency, args.deadline,
                sampling=(("temperature", 0.0), ("ignore_eos", False)))
    run = run_load(Target(url, args.api_key, None, args.timeout), plan)
    sent = [run.sent[i] for i in sorted(run.sent)]
    summary = summarize([s.outcome for s in sent], max(run.duration_s, 1e-9), args.slo)
    return run, summary, httpx.get(f"{url}/metrics", timeout=30).text


def _offline(args, wafer: list, prompts: tuple) -> dict:
    """`waferrt generate --json` on the same prompts (each an argument: a drawn prompt may hold a newline),
    asking --output-len tokens of each."""
    cmd = [sys.executable, "-m", "waferrt.cli", "generate", "--json", "--max-new-tokens", str(args.output_len),
           *wafer, "--", *(p.prompt for p in prompts)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=GENERATE_DEADLINE_S, env=env)
    if done.returncode:
        sys.exit(f"waferrt generate failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _texts(run) -> list:
    return [run.sent[i].text if run.sent[i].outcome.success else None for i in sorted(run.sent)]


def _offline_rate(offline: dict) -> float:
    return offline["generated"] / offline["wall_s"]


def _summary_rows(s, offline: dict, ratios: list, chaos: dict | None) -> list[tuple[str, str]]:
    off = _offline_rate(offline)
    spread = f" (median of {len(ratios)} rounds, {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    rows = [("requests completed / failed", f"{s.completed} / {s.failed}"),
            ("serving output throughput", f"{s.output_throughput:.2f} tok/s ({s.request_throughput:.3f} req/s)"),
            ("offline (generate) output throughput", f"{off:.2f} tok/s"),
            ("serving / offline", f"{statistics.median(ratios):.2f}{spread}")]
    for clock in ("wall", "modelled"):
        lat = getattr(s, clock)
        for metric in ("ttft", "tpot", "itl", "e2el"):
            sp = None if lat is None else getattr(lat, metric)
            if sp is not None and (clock == "wall" or metric != "itl"):
                rows.append((f"{clock} {metric.upper()} ms: mean / median / p90 / p99",
                             f"{sp.mean_ms:.4g} / {sp.median_ms:.4g} / {sp.p90_ms:.4g} / {sp.p99_ms:.4g}"))
    if chaos:
        rows.append((f"under --chaos {chaos['chaos']}: lost / texts differing / faults recovered of injected",
                     f"{chaos['failed']} / {chaos['differ']} / {chaos['recovered']:.0f} of {chaos['injected']:.0f}"))
    return rows


def _round(args, wafer: list, prompts: tuple) -> tuple:
    """Serving then offline on the same prompts: (the load's Run, its Summary, generate's JSON, texts equal)."""
    with serving(wafer, deadline_s=600) as srv:
        run, s, _ = _load(args, srv.url, prompts)
    print(bench.table(s), flush=True)
    offline = _offline(args, wafer, prompts)
    same = sum(a == b for a, b in zip(_texts(run), offline["text"] if len(prompts) > 1 else [offline["text"]]))
    print(f"offline: {offline['generated']} tokens in {offline['wall_s']:.2f} s; texts equal to serving's: "
          f"{same} of {len(prompts)}; serving / offline {s.output_throughput / _offline_rate(offline):.2f}",
          flush=True)
    return run, s, offline, same


def _chaos(args, wafer: list, prompts: tuple, texts: list) -> tuple:
    """The load under --chaos: (its Run, the summary row's figures)."""
    with serving([*wafer, "--chaos", args.chaos], deadline_s=600) as srv:
        crun, cs, cmetrics = _load(args, srv.url, prompts)
    print(bench.table(cs), flush=True)
    return crun, {"chaos": args.chaos, "failed": cs.failed, "differ": sum(a != b for a, b in zip(_texts(crun), texts)),
                  "injected": _metric(cmetrics, "waferrt:faults_injected_total"),
                  "recovered": _metric(cmetrics, "waferrt:faults_recovered_total")}


def main() -> int:
    args = _args()
    wafer = shlex.split(args.wafer)
    prompts = tuple(Prompt(p.prompt, args.output_len) for p in bench.prompts(args))
    print(f"{len(prompts)} requests, {args.output_len} tokens each, request rate {args.request_rate}", flush=True)
    rounds = [_round(args, wafer, prompts) for _ in range(max(1, args.rounds))]
    ratios = [s.output_throughput / _offline_rate(off) for _, s, off, _ in rounds]
    run, s, offline, same = sorted(rounds, key=lambda r: r[1].output_throughput / _offline_rate(r[2]))[len(rounds) // 2]
    crun, chaos = _chaos(args, wafer, prompts, _texts(run)) if not args.no_chaos else (None, None)
    rows = _summary_rows(s, offline, ratios, chaos)
    if args.markdown:
        print("\n| measure | value |\n| --- | --- |\n" + "\n".join(f"| {a} | {b} |" for a, b in rows))
    else:
        print("\n".join(f"{a:70s} {b}" for a, b in rows))
    if args.save_result:
        bench.save_json(args.save_result, {
            "serving": dataclasses.asdict(s), "offline": offline, "ratios": ratios, "chaos": chaos,
            "texts_equal_offline": same, "prompts": [p.prompt for p in prompts], "serving_texts": _texts(run),
            "serving_tokens": [run.sent[i].outcome.output_tokens for i in sorted(run.sent)],
            "chaos_texts": None if crun is None else _texts(crun)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
