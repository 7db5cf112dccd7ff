"""Real dimensions: Llama3-8B cut to N layers, its real vocabulary and untied head, decoded on WSE-2 at real sizes.

What it does, in one run, and prints:

1. ``waferrt convert``'s model (``waferrt.model.convert``): Llama3-8B's layers at their real size (dim 4096,
   32/8 heads, head_dim 128, hidden 14336, rope theta 500000), ``--layers N`` of them (2), the real
   128256-token vocabulary and the real untied output head (``--vocab`` cuts the vocabulary), seeded weights,
   float16 values. Written to a temp dir (or ``--gguf PATH``), then read through the dequantised-weights cache.
2. The plan: the planner's narrowest layer region that holds a layer in a WSE-2 core's 48 KB (float16
   weights and K/V, ``--kv-tokens`` x the prompts); a tile is one such region wide and as tall as the
   embedding's and the head's bands together (both in the first tile: tokens are sampled where they enter);
   ``--nodes K`` tiles (2) in a row, one per Ray node started on this machine (``LocalCluster``), or on the
   cluster at ``--address`` (its nodes as they are). What each node's tiles hold is printed: the memory a node
   needs for this placement.
3. The numpy ReferenceModel's tokens (greedy) and the wafer's, for every prompt: they must be equal.
4. Wall time of every phase, RSS per tile (psutil on the actors' pids; peak from /proc), what each tile holds.
5. The decode step: the wafer's (a request's time from one token to its next) over the anchor's in the same run
   (benchmarks/anchor.py: one numpy process, one BLAS thread by threadpoolctl, float32 weights, the same layers,
   vocabulary and requests; goal <= 3.0 with 2 requests on a 2-core machine), and the load average then.
6. Modelled cycles per layer: every decode step's layer run as the tiles booked it (its micro-batch of one
   token; the hand-over into the region taken off with the one formula the tiles book it with) next to the
   estimator's for the same region and context (``scheduler.speed.stage_seconds``), and their ratio.

    python benchmarks/realdims.py [--layers 2] [--nodes 2] [--vocab V] [--address HOST:PORT] [--gguf PATH]
                                  [--prompts 2] [--tokens 8] [--kv-tokens 64] [--lanes 2]

Memory (--layers 2, the real vocabulary): the driver holds the anchor's float32 copies for a while (the two
tables 2.1 GB each, a layer 0.87 GB); the tile of the tables 3.3 GB (the embedding at float16, the head cut
into float32); a layer ~0.9 GB on its tile. A few minutes on 2 quiet cores, 15 on a loaded machine. Not a
test (the unit tests tie the same numbers at these dimensions without Ray: tests/unit/test_realdims.py; an
untied head on the tiny model: tests/unit/test_untied.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the reference runs single-threaded, like a tile

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
from anchor import Anchor  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from waferrt.core.mesh import MeshSpec  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.decode.cost import handover_cost  # noqa: E402
from waferrt.decode.stage import StageKind  # noqa: E402
from waferrt.model.convert import Cut  # noqa: E402
from waferrt.scheduler import KVReserve, PlanOptions, plan, plan_report  # noqa: E402
from waferrt.scheduler.budget import embed_rows_needed, head_tables, layer_shapes  # noqa: E402
from waferrt.scheduler.speed import stage_seconds  # noqa: E402
from waferrt.scheduler.types import Workload  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time,"]
SHAPE = "llama3-8b"


@dataclass(frozen=True)
class Run:
    """How the wafer decodes: the sampler, the Ray cluster's address, the micro-batches in flight, the fault to
    recover from ("core", "tile" or "": none)."""

    sampler: object
    address: str
    lanes: int
    fault: str = ""


FAULT_STEP = 6  # the fault fires at the 6th micro-batch its tile runs once armed: mid-prompt, K/V already held


def fault_of(placement, kind: str):
    """The fault `--fault kind` injects: a dead core (the first of layer 0's region: the layer, 436 MB at float16,
    and its K/V move to a free slot) or a killed tile (layer 0's: restarted, its layers loaded again)."""
    from waferrt.faults.model import CoreFailure, TileCrash, Trigger

    region = placement.layers[0]
    if kind == "core":
        return CoreFailure(min(region.cores()), Trigger(step=FAULT_STEP))
    return TileCrash(placement.mesh.tiles_of(region)[0], Trigger(step=FAULT_STEP))


@contextmanager
def faults(llm, kind: str):
    """``llm.faults`` of a plan holding `kind`'s fault (tolerant: generate recovers from it), or no session."""
    if not kind:
        yield None
        return
    from waferrt.faults.model import FaultPlan

    with llm.faults(FaultPlan((fault_of(llm.placement, kind),))) as session:
        yield session


@contextmanager
def timed(what: str, times: dict):
    t0 = time.perf_counter()
    yield
    times[what] = time.perf_counter() - t0


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def mesh_for(config, kv: KVReserve, dtype: str, nodes: int) -> MeshSpec:
    """`nodes` tiles in a row (wrapped into rows as wide as the wafer), each the planner's narrowest layer region
    (budget.layer_shapes' first) wide and as tall as the embedding's band and the head's (an untied model's)
    together, in whole layer slots: the first tile holds the tables, the others the layers."""
    w, h = layer_shapes(Workload(config, kv, dtype), WSE2.sram_bytes, *WSE2.full_mesh)[0]
    band = -(-embed_rows_needed(config, WSE2.sram_bytes, w, dtype) // h) * h
    th = band * head_tables(config)
    slots = (nodes - 1) * (th // h)
    if slots < config.n_layers:
        raise SystemExit(f"--layers {config.n_layers} needs more tiles: {nodes - 1} tiles of {th // h} layer slots "
                         f"beside the tables' tile hold {slots}; give --nodes {2 + (config.n_layers - 1) // (th // h)}")
    across = min(nodes, WSE2.full_mesh[0] // w)  # a row of tiles, wrapped into more rows on the wafer
    return MeshSpec(across * w, -(-nodes // across) * th, w, th)


def layer_cycles(setup, stats) -> list[tuple[int, int, float, float]]:
    """(layer, position, booked cycles, estimated cycles) of every layer run on a micro-batch of one token:
    the booked run without its hand-over into the region, the estimator's layer on the same region at the
    same context (the token's position + 1)."""
    stages, out = setup.stages(), []
    for run in stats.runs:
        stage = stages[run.stage]
        if stage.kind is not StageKind.LAYER or len(run.items) != 1:
            continue
        pos = run.items[0].pos
        hand = handover_cost(WSE2, stages[run.stage - 1].region, stage.region, 4 * setup.config.dim).cycles
        est = stage_seconds(WSE2, setup.decoding, [stage], pos + 1, 1)[0] * WSE2.clock_hz
        out.append((stage.layer, pos, run.cycles - hand, est))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="a model written by `waferrt convert` (default: write one to a temp dir)")
    ap.add_argument("--layers", type=int, default=2, help="Llama3-8B's layers to decode, 1..32 (2)")
    ap.add_argument("--nodes", type=int, default=2, help="tiles, one per Ray node, at least 2 (2)")
    ap.add_argument("--vocab", type=int, default=0, help="cut the vocabulary to V tokens (0: the real 128256)")
    ap.add_argument("--address", help="a running Ray cluster's address (default: start --nodes loopback nodes)")
    ap.add_argument("--fault", choices=("core", "tile"), default="",
                    help="during the decode, kill a core of layer 0's region (core) or layer 0's tile (tile); the "
                         "decode recovers (re-plan, weights moved, tokens replayed) and the recovery is timed")
    ap.add_argument("--prompts", type=int, default=2, choices=(1, 2), help="prompts decoded (2)")
    ap.add_argument("--tokens", type=int, default=8, help="new tokens per prompt (8)")
    ap.add_argument("--kv-tokens", type=int, default=64, help="K/V positions reserved per request (64)")
    ap.add_argument("--lanes", type=int, default=2, choices=(1, 2),
                    help="micro-batches in flight (2, as `waferrt generate`: the layer tiles compute side by side, "
                         "each request its own micro-batch; 1: the requests in one micro-batch, each layer's "
                         "weights read once a step, as the anchor's)")
    args = ap.parse_args()
    if args.nodes < 2:
        ap.error(f"--nodes {args.nodes}: give at least 2 (the tables' tile and one of layers)")
    try:
        args.cut = Cut(SHAPE, layers=args.layers, vocab=args.vocab, seed=0, dtype="float16")
    except ValueError as e:
        ap.error(str(e))
    with tempfile.TemporaryDirectory(prefix="waferrt-realdims-") as tmp:
        os.environ["WAFERRT_CACHE"] = str(Path(tmp) / "cache")  # the dequantised weights: removed with tmp
        run(args, Path(tmp))


def run(args, tmp: Path) -> None:
    from waferrt.actors.localcluster import LocalCluster
    from waferrt.model import Sampler, Tokenizer
    from waferrt.serving import GenRequest, generate_reference

    times: dict[str, float] = {}
    config, weights, meta = model(args.gguf, args.cut, tmp, times)
    tok, greedy = Tokenizer(meta), Sampler()
    reqs = [GenRequest(tuple(tok.encode(p)), args.tokens) for p in PROMPTS[:args.prompts]]
    with timed("reference decode (numpy, one process)", times):
        ref, _ = generate_reference(config, weights, reqs, greedy)
    with timed("anchor decode (numpy, one process, one BLAS thread, float32)", times), threadpool_limits(1):
        anchor_tokens, _, anchor_steps = Anchor(config, weights).generate(reqs)  # its float32 copies freed here
    kv = KVReserve(args.kv_tokens, len(reqs))
    mesh = mesh_for(config, kv, args.cut.dtype, args.nodes)
    with timed(f"{args.nodes} Ray nodes up (LocalCluster)" if not args.address else "joined the cluster", times):
        cluster = (LocalCluster(args.nodes) if not args.address else Joined(args.address)).__enter__()
    try:
        with timed("plan", times):
            placement = plan(config, WSE2, mesh, kv=kv,
                             options=PlanOptions(dtype=args.cut.dtype, nodes=cluster.node_infos()))
        got = wafer(placement, weights, reqs, Run(greedy, cluster.address, args.lanes, args.fault), times)
    finally:
        with timed("cluster down", times):
            cluster.__exit__(None, None, None)
    got["anchor"] = (anchor_tokens, anchor_steps)
    report(placement, [c.tokens for c in ref], got, times)


class Joined:
    """A running Ray cluster at `address` (``--address``), as a LocalCluster is used: its address, its nodes."""

    def __init__(self, address: str):
        self.address = address

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def node_infos(self) -> tuple:
        from waferrt.cli.placing import ray_nodes

        return ray_nodes(self.address)


def model(gguf: Path | None, cut: Cut, tmp: Path, times: dict):
    """(config, weights, tokenizer metadata) of `gguf`, or of `cut` written into `tmp`, through the cache."""
    from waferrt.model import load_model
    from waferrt.model.convert import write_cut

    path = gguf
    if path is None:
        path = tmp / f"llama3-8b-{cut.layers}l.gguf"
        with timed("convert: write the GGUF", times):
            write_cut(path, cut)
    with timed("load: dequantise into the cache", times):
        load_model(path)
    with timed("load: map from the cache", times):
        config, weights, meta = load_model(path)
    what = cut.describe() if gguf is None else (
        f"dim {config.dim}, heads {config.n_heads}/{config.n_kv_heads}, hidden {config.hidden_dim}, "
        f"{config.n_layers} layers, vocab {config.vocab_size}")
    print(f"model: {what}\n  {path}: {path.stat().st_size / 1e9:.2f} GB")
    return config, weights, meta


def wafer(placement, weights, reqs, how: Run, times: dict) -> dict:
    """Decode `reqs` on the tiles as `how` says: tokens, stats, setup, and per tile (pid, RSS now, peak RSS,
    bytes held)."""
    from dataclasses import replace

    from waferrt.actors.tile import Tile
    from waferrt.llm import LLM_LAUNCH, WaferLLM

    llm = WaferLLM(placement.config, None, placement, lanes=how.lanes, launch=replace(LLM_LAUNCH, address=how.address))
    try:
        with timed("wafer: tile actors up, SRAM booked", times):
            llm.open()
        with timed("wafer: weights cut into the cores' blocks", times):
            llm.load(weights)
        with timed("wafer decode", times), faults(llm, how.fault) as session:
            out, stats = llm.generate(reqs, how.sampler)
        tiles = llm.wafer.tiles
        pids = llm.wafer.on_every_tile(Tile.pid)
        held = llm.wafer.on_every_tile(Tile.decode_bytes)
        rss = {t: (pid, psutil.Process(pid).memory_info().rss, peak_rss(pid), h)
               for t, pid, h in zip(tiles, pids, held, strict=True)}
        return {"tokens": [c.tokens for c in out], "stats": stats, "setup": llm.setup, "rss": rss,
                "mapped": len(llm.wafer.local_tiles()), "faults": session.log.events if session else [],
                "placement": llm.placement}
    finally:
        with timed("wafer: close", times):
            llm.close()


def report(placement, ref_tokens, got: dict, times: dict) -> None:
    stats, setup = got["stats"], got["setup"]
    print(f"plan: {placement.mesh} on {WSE2.name} ({WSE2.sram_bytes // 1024} KB per core), {placement.dtype}; "
          f"embedding on {placement.embed}, head on {placement.head_region}, "
          f"layers on {', '.join(str(r) for r in placement.layers)}; "
          f"K/V {placement.kv_tokens} positions x {placement.kv.requests} requests; tiles on nodes "
          + ", ".join(f"{t} {n[:8]}" for t, n in placement.tile_nodes))
    same = ref_tokens == got["tokens"]
    print(f"tokens: reference {ref_tokens}\n        wafer     {got['tokens']}  -> "
          + ("EQUAL" if same else "DIFFERENT"))
    print("wall time: " + "; ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    print(f"weights: {got['mapped']} of {len(got['rss'])} tiles (on this machine, on any Ray node) mapped them from "
          "the cache themselves; the others through Ray")
    print("RSS per tile (now / peak; its weight blocks and K/V): " + "; ".join(
        f"{t} pid {pid}: {now / 2**20:,.0f} / {peak / 2**20:,.0f} MB ({held / 2**20:,.0f} MB)"
        for t, (pid, now, peak, held) in got["rss"].items()))
    nodes(placement, got["rss"])
    print(f"modelled: {stats.modelled_s * 1e3:.3f} ms for {stats.tokens} tokens "
          f"({stats.wafer_tokens_per_s:,.0f} tok/s on the modelled wafer)")
    rows = layer_cycles(setup, stats)
    print("modelled cycles per layer, decode steps (one token per micro-batch):\n"
          "| layer | position | emulated (tiles' ledger) | estimated (same region, same context) | ratio |\n"
          "| --- | --- | --- | --- | --- |")
    for layer, pos, ran, est in sorted(rows):
        print(f"| {layer} | {pos} | {ran:,.1f} ({ran / WSE2.clock_hz * 1e6:.2f} us) | {est:,.1f} | {ran / est:.6f} |")
    if not rows:
        print("(no decode step of one token per micro-batch ran: give --tokens 2 or more, --lanes 2)")
    steps(got, len(ref_tokens))
    recoveries(got["faults"])
    if not same:
        raise SystemExit("the wafer's tokens differ from the reference's")


def nodes(placement, rss: dict) -> None:
    """What each Ray node's tiles hold (their weight bytes at the storage dtype, the planner's tile_work; their K/V)
    and their peak RSS summed: the memory that node needs for this placement, measured."""
    work = {t.tile: t for t in plan_report(placement).tile_work}
    per: dict[str, list[int]] = {}
    for tile, name in placement.tile_nodes:
        got = per.setdefault(name, [0, 0])
        got[0] += work[(tile.tx, tile.ty)].weight_bytes
        got[1] += rss[tile][2] if tile in rss else 0
    print("per Ray node (weights its tiles hold at the storage dtype / their peak RSS summed): " + "; ".join(
        f"{name[:8]} {w / 2**30:.2f} / {peak / 2**30:.2f} GiB" for name, (w, peak) in per.items()))


def recoveries(events) -> None:
    """Every injected fault: when it fired, how long finding it and recovering from it took (wall), what recovery
    did, and its cost on the modelled wafer."""
    for e in events:
        if e.fired_at is None:
            print(f"fault {e.kind} at {e.where}: did not fire (the decode ended first: give more --tokens)")
            continue
        found = e.detected_at - e.fired_at if e.detected_at else float("nan")
        took = e.recovered_at - e.detected_at if e.recovered_at and e.detected_at else float("nan")
        print(f"fault {e.kind} at {e.where}, step {e.step}: found after {found:.1f} s ({e.detected_by}); recovered "
              f"in {took:.1f} s: {e.action}; modelled {e.modelled_s * 1e3:.3f} ms")


def steps(got: dict, requests: int) -> None:
    """The wafer's decode step (a request's time from one token to its next, the mean) over the anchor's (one
    step of all the requests together), measured in this run, and the machine's load then."""
    anchor_tokens, anchor_steps = got["anchor"]
    wafer_steps = got["stats"].token_latency_s
    if not anchor_steps or not wafer_steps:
        print("(no decode step ran: give --tokens 2 or more)")
        return
    a, w = sum(anchor_steps) / len(anchor_steps), sum(wafer_steps) / len(wafer_steps)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"decode step, {requests} requests: wafer {w:.3f} s / anchor {a:.3f} s = {w / a:.2f} (goal <= 3.0); "
          f"the anchor's tokens {'=' if anchor_tokens == got['tokens'] else '!='} the wafer's; "
          f"load average {load} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
