"""Where a decode's wall time goes, tile by tile and on the host: a Perfetto trace of one run, summed.

Starts the wafer as `waferrt generate` runs it (the planner's placement in one tile per core here, unless
--mesh/--tile), warms it up, decodes R requests x T new tokens once untraced (its tok/s) and once with
``trace=PATH`` (waferrt.serving.trace: every stage run, wait and send on each tile's track, next to the
host's spans and a mark per token), and prints from the trace:

- the host: when the first and the last token came, and how long the decode went on after the last one
  (stopping the tiles, the modelled schedule);
- per tile: its track's span, the time in its stage runs by kind (embed, layer, head) with their count and
  mean, in waits for a micro-batch, in sends, the rest (the loop), its busy share (stage runs and sends over
  the span), and the CPU seconds of its process in the traced run (psutil).

A tile busy ~95% of its span is the pipeline's bottleneck; its waits are what the other tile (or the fill
at the start) made it lose. The trace is kept (--out) to open in ui.perfetto.dev.

    python benchmarks/trace_decode.py [--tokens 48] [--requests 8] [--out PATH] [--mesh WxH --tile TWxTH]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAY_worker_niceness", "0")  # as benchmarks/decode.py

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import psutil  # noqa: E402
from decode import PROMPTS, wxh  # noqa: E402

from waferrt.actors.tile import Tile  # noqa: E402
from waferrt.cli.placing import local_tiles  # noqa: E402
from waferrt.core.mesh import MeshSpec  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.llm import WaferLLM  # noqa: E402
from waferrt.model import Sampler, Tokenizer, load_model  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan  # noqa: E402
from waferrt.serving import GenRequest  # noqa: E402


def tracks(path: str) -> dict[str, list[dict]]:
    """The trace's complete ("X") and instant ("i") events by track name (the host, each tile, ...)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M"
             and e["name"] == "thread_name"}
    out = collections.defaultdict(list)
    for e in events:
        if e.get("ph") in ("X", "i"):
            out[names.get((e["pid"], e["tid"]), str(e["tid"]))].append(e)
    return out


def host_line(host: list[dict]) -> str:
    decode = next(e for e in host if e["name"] == "decode")
    t0, end = decode["ts"], decode["ts"] + decode["dur"]
    tokens = sorted(e["ts"] for e in host if e["name"] == "token")
    return (f"host: decode {decode['dur'] / 1e3:,.0f} ms; first token at {(tokens[0] - t0) / 1e3:,.0f} ms, the last "
            f"at {(tokens[-1] - t0) / 1e3:,.0f} ms; {(end - tokens[-1]) / 1e3:,.0f} ms after it (stop, schedule)")


def tile_row(name: str, events: list[dict], cpu_s: float) -> str:
    """A tile's row of the table: span, stage runs by kind, waits, sends, the rest, busy share, CPU."""
    spent, count = collections.Counter(), collections.Counter()
    for e in events:
        cat = e.get("cat")
        kind = ("layer" if e["name"].startswith("layer") else e["name"]) if cat == "compute" else \
            "wait" if cat == "wait" else "send" if e["name"].startswith("send") else None
        if kind:
            spent[kind] += e["dur"] / 1e3
            count[kind] += 1
    span = (max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events)) / 1e3
    runs = " + ".join(f"{k} {spent[k]:,.0f} ({count[k]} x {spent[k] / count[k]:.2f})"
                      for k in ("embed", "layer", "head") if count[k])
    busy = sum(spent[k] for k in ("embed", "layer", "head", "send"))
    return (f"| {name} | {span:,.0f} | {runs} | {spent['wait']:,.0f} | {spent['send']:,.0f} | "
            f"{span - busy - spent['wait']:,.0f} | {100 * busy / span:.0f}% | {cpu_s:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request (48)")
    ap.add_argument("--requests", type=int, default=8, help="requests in flight (8)")
    ap.add_argument("--out", help="where to keep the trace (default: a temporary file)")
    ap.add_argument("--mesh", type=wxh, help="mesh WxH in cores (default: the planner's, as `waferrt generate`)")
    ap.add_argument("--tile", type=wxh, help="tile TWxTH in cores (with --mesh)")
    args = ap.parse_args()
    config, weights, meta = load_model()
    tok = Tokenizer(meta)
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]
    kv = KVReserve(512, args.requests)
    mesh = MeshSpec(*args.mesh, *args.tile) if args.mesh else default_mesh(config, WSE2, kv).in_tiles(local_tiles())
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="waferrt-trace-"), "decode.json")
    with WaferLLM(config, weights, plan(config, WSE2, mesh, kv=kv)) as llm:
        llm.generate(reqs[:1], Sampler())  # warm-up
        _, plain = llm.generate(reqs, Sampler())
        procs = dict(zip(llm.wafer.tiles, map(psutil.Process, llm.wafer.on_every_tile(Tile.pid)), strict=True))
        before = {t: sum(p.cpu_times()[:2]) for t, p in procs.items()}
        _, traced = llm.generate(reqs, Sampler(), trace=out)
        cpu = {str(t): sum(p.cpu_times()[:2]) - before[t] for t, p in procs.items()}
    print(f"{len(reqs)} requests x {args.tokens} new tokens on {mesh}: {plain.tokens / plain.wall_s:.1f} tok/s "
          f"untraced, {traced.tokens / traced.wall_s:.1f} traced\n")
    by = tracks(out)
    print(host_line(by["host"]) + "\n")
    print("| tile | span (ms) | stage runs (ms; count x mean) | waits | sends | the rest | busy | CPU s |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in sorted(n for n in by if n.startswith("tile(")):
        print(tile_row(name, by[name], cpu.get(name, float("nan"))))
    print(f"\n(the trace: {out}; open it in ui.perfetto.dev)")


if __name__ == "__main__":
    main()
