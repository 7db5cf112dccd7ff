"""Generates docs/scaling.md: how the primitives and the parallelism strategies scale to a whole wafer.

Side by side, in one run, all from the closed forms the emulator is tested against (waferrt.core.cost,
waferrt.decode.cost) except where it says "emulated":

1. K-tree vs ring vs pipeline allreduce, and MeshGEMV (a 4096 x 4096 matrix), as the mesh side grows
   from 16 to 720 cores (WSE-2 figures);
2. the same allreduces emulated hop by hop (LoopFabric, no Ray) on lines of 16 and 64 cores: the counts
   the emulator books next to the closed forms;
3. Llama3-8B and Qwen2-72B on WSE-2 and WSE-3: the layer and tensor strategies and the planner's picks
   (and weight streaming where they do not fit);
4. a decode step emulated (the tile programs over a LoopFabric) next to the estimate of the same placement,
   for every strategy the emulator runs (layer regions, groups, one region for every layer) and for weight
   streaming (one region, the blocks streamed in);
5. the topologies (core.topology: mesh, torus, mesh-switch): allreduce and all-to-all time against the line's
   length, and the same collectives emulated on a torus and a mesh-switch next to their closed forms;
6. training on paper (waferrt.estimator.train): weight streaming, a resident 1F1B pipeline and tensor-stream
   partition for Llama3-8B and SmolLM2-135M on every wafer template, and the planner's pick.

    python benchmarks/scaling.py [--out docs/scaling.md]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from waferrt.core.arith import cdiv
from waferrt.core.cost import (
    ALLREDUCE_ALGOS,
    GemvBlock,
    allreduce_cost,
    compute_cost,
    gemv_cost,
    line_alltoall_cost,
    reduce_flops,
)
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY, WSE2, WSE3
from waferrt.core.template import TEMPLATES
from waferrt.core.topology import Topology
from waferrt.core.train_cost import TrainShape
from waferrt.decode.schedule import round_seconds
from waferrt.estimator.estimate import estimate
from waferrt.estimator.streaming import streaming
from waferrt.estimator.train import TrainJob, estimate_train
from waferrt.fabric.loop import simulate
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.config import SMOLLM2_135M
from waferrt.model.zoo import MODELS
from waferrt.scheduler import KVReserve, PlanOptions, default_mesh, plan
from waferrt.scheduler.placement import plan_streaming, streaming_mesh
from waferrt.scheduler.speed import placement_seconds
from waferrt.scheduler.types import Objective, Strategy
from waferrt.serving import GenRequest, LocalDecoder

SIDES = (16, 32, 64, 128, 256, 512, 720)
DIM = 4096


def primitives() -> list[str]:
    out = ["## 1. Allreduce and MeshGEMV as the mesh side grows (WSE-2, closed forms)", "",
           f"An allreduce of one core's block of a {DIM}-long vector cut over n cores (4 x {DIM}/n bytes) along a "
           f"line of n cores, and MeshGEMV of a {DIM} x {DIM} matrix on an n x n region (local block GEMV, then "
           "the allreduce), in cycles and microseconds at 1.1 GHz.", "",
           "| n | K-tree (K=2) | chain | ring | pipeline | MeshGEMV K-tree | MeshGEMV chain | MeshGEMV ring | "
           "MeshGEMV pipeline | best |", "|---:" * (1 + 2 * len(ALLREDUCE_ALGOS)) + "|---|"]
    for n in SIDES:
        nbytes = 4 * cdiv(DIM, n)
        ar = {a: allreduce_cost(WSE2, a, n, nbytes).cycles for a in ALLREDUCE_ALGOS}
        gv = {a: gemv_cost(WSE2, GemvBlock(cdiv(DIM, n), cdiv(DIM, n)), n, a).cycles for a in ALLREDUCE_ALGOS}
        best = min(gv, key=gv.get)
        cells = [f"{ar[a]:,.0f}" for a in ALLREDUCE_ALGOS] + [
            f"{gv[a]:,.0f} ({gv[a] / WSE2.clock_hz * 1e6:.1f} us)" for a in ALLREDUCE_ALGOS]
        out.append(f"| {n} | " + " | ".join(cells) + f" | {best} |")
    return out + ["", "The K-tree's routing stages grow as K n^(1/K) / 2 (WaferLLM's: groups rooted in their middle, "
                  "partial sums streamed), the chain's as n-1, the ring's and pipeline's as 2(n-1): on long lines "
                  "the K-tree wins by an order of magnitude, while the local GEMV shrinks as 1/n^2.", ""]


def emulated_primitives() -> list[str]:
    out = ["## 2. The same allreduces emulated hop by hop (LoopFabric, 16-core tiles, no Ray)", "",
           "| line | algorithm | emulated hops / stages / messages / link bytes / cycles | closed form | equal |",
           "|---|---|---|---|---|"]
    for n in (16, 64):
        mesh = MeshSpec(n, 1, 16, 1)
        x = np.ones((1, n, 32), np.float32)
        for algo in ALLREDUCE_ALGOS:
            _, cost = simulate(mesh, WSE2, mesh.region, lambda ctx, x, a=algo: ctx.allreduce(x, "x", a), x=x)
            reductions = compute_cost(WSE2, reduce_flops(algo, n, 32))  # the kernel context books them too
            got, want = cost[f"allreduce.{algo}"], allreduce_cost(WSE2, algo, n, 4 * 32) + reductions
            show = [(c.hops, c.stages, c.messages, c.link_bytes, round(c.cycles)) for c in (got, want)]
            out.append(f"| 1x{n} | {algo} | {show[0]} | {show[1]} | {'yes' if got == want else 'NO'} |")
    return out + [""]


def _row(e, what: str) -> str:
    if not e.fits:
        return f"| {what} | does not fit | | | | |"
    s = e.shape
    return (f"| {what} | {e.strategy.describe()} | {s.cols}x{s.rows} (G={s.head_groups}) | "
            f"{e.time_per_token_s * 1e3:.3f} ms ({e.request_tokens_per_s:,.0f}/s) | {e.tokens_per_s:,.0f} | "
            f"{e.bound} |")


def strategies() -> list[str]:
    out = ["## 3. Both strategies at wafer scale (float16, K/V 4096 tokens x 8 requests)", ""]
    kv = KVReserve(4096, 8)
    for name in ("llama3-8b", "qwen2-72b"):
        m = MODELS[name]
        for spec in (WSE2, WSE3):
            out += [f"### {m.label} on {spec.name} ({spec.full_mesh[0]}x{spec.full_mesh[1]} cores)", "",
                    "| asked | strategy | layer region | one request | tokens/s, 8 in flight | bound |",
                    "|---|---|---|---:|---:|---|"]
            n = m.config.n_layers
            for what, tried, obj in (("layer", [Strategy(1, n)], "latency"), ("tensor", [Strategy(n, n)], "latency"),
                                     ("planner, latency", None, "latency"),
                                     ("planner, throughput", None, "throughput")):
                e = estimate(m.config, spec, spec.full_mesh, kv, "float16", Objective(obj, tried))
                out.append(_row(replace(e, label=m.label), what))
            tensor1 = replace(estimate(m.config, spec, spec.full_mesh, KVReserve(4096, 1), "float16",
                                       Objective("latency", (Strategy(n, n),))), label=m.label)
            out.append(_row(tensor1, "tensor, 1 request"))
            s = streaming(m.config, spec, spec.full_mesh, kv, "float16")
            if s.fits:
                out += ["", f"Weight streaming: {s.weight_bytes / 1e9:.1f} GB of weights per step over "
                        f"{spec.ingress_bytes_per_s / 1e9:.0f} GB/s: {1 / s.time_per_token_s:,.1f} tokens/s for one "
                        f"request, {s.tokens_per_s:,.1f} with 8 in flight (bound {s.ingress_bound_tokens_per_s:,.1f}); "
                        f"compute would outlast the stream from {s.knee_requests:,} requests in flight, but K/V room "
                        f"ends at {s.max_requests:,}."]
            out.append("")
    return out


def _emulate(p, requests: int, tokens: int) -> float:
    """Modelled seconds of the last round of `requests` decoding `tokens` tokens each on the tile programs
    (no Ray)."""
    dec = LocalDecoder(p.config, synthetic_llama(p.config, seed=0), p)
    _, stats = dec.generate([GenRequest((3 + i,), tokens) for i in range(requests)], Sampler())
    return round_seconds(stats.runs, len(dec.setup.stages()) - 1, p.spec.clock_hz)


def emulated_decode() -> list[str]:
    out = ["## 4. A decode step emulated vs the estimate of the same placement", "",
           "The tile programs run a real step (synthetic weights) over a LoopFabric and book their cycles; the "
           "estimate times the same placement from the closed forms (`placement_seconds`).", "",
           "| model, mesh | strategy | requests | emulated step | estimated step | ratio | emulation wall |",
           "|---|---|---:|---:|---:|---:|---:|"]
    config, kv = tiny_config(), KVReserve(512, 8)
    tiny_mesh, tiny_kv, n = MeshSpec(16, 16, 8, 8), KVReserve(32, 4), SMOLLM2_135M.n_layers
    cases = [(plan(config, TINY, tiny_mesh, kv=tiny_kv,
                   options=PlanOptions(strategy=Strategy(g, config.n_layers))), "tiny config (tiny)")
             for g in (1, 2, 3)]
    cases.append((plan_streaming(config, TINY, streaming_mesh(config, TINY, KVReserve(16, 3)), kv=KVReserve(16, 3)),
                  "tiny config (tiny), streaming"))
    for g in (1, 15, n):
        s = Strategy(g, n)
        options = PlanOptions(strategy=s)
        cases.append((plan(SMOLLM2_135M, WSE2, default_mesh(SMOLLM2_135M, WSE2, kv, options=options), kv=kv,
                           options=options),
                      "SmolLM2-135M (wse2), default mesh"))
    stream_kv = KVReserve(512, 8)
    cases.append((plan_streaming(SMOLLM2_135M, WSE2, streaming_mesh(SMOLLM2_135M, WSE2, stream_kv), kv=stream_kv),
                  "SmolLM2-135M (wse2), streaming"))
    for p, what in cases:
        how = "weight streaming" if p.streaming else p.strategy.describe()
        for r in (1, 3):
            t0 = time.perf_counter()
            emulated = _emulate(p, r, 3)  # the last round holds 3 positions
            wall = time.perf_counter() - t0
            modelled = placement_seconds(p, r, context=3)[1]
            out.append(f"| {what} {p.mesh.width}x{p.mesh.height} | {how} | {r} | {emulated * 1e6:,.2f} us | "
                       f"{modelled * 1e6:,.2f} us | {emulated / modelled:.6f} | {wall:.1f} s |")
    return out + [""]


TOPOLOGIES = (Topology("mesh"), Topology("torus"), Topology("mesh-switch"))


def topologies() -> list[str]:
    out = ["## 5. Topologies: allreduce and all-to-all against the line's length (WSE-2 figures, closed forms)", "",
           f"The allreduce of section 1 (4 x {DIM}/n bytes per core) and an all-to-all of a {DIM}-long float32 "
           "vector per core (n chunks, one to every core of the line), in cycles, on a line of n cores of a 2D mesh, "
           "a torus (wrap links at the line's ends) and a mesh-switch (NoW: a switch port every 16 cores).", "",
           "| n | " + " | ".join(f"{a} {t}" for a in ("K-tree", "ring", "all-to-all") for t in TOPOLOGIES) + " |",
           "|---:" * (1 + 3 * len(TOPOLOGIES)) + "|"]
    for n in SIDES:
        specs = [WSE2.replace(topology=t) for t in TOPOLOGIES]
        cells = [allreduce_cost(s, "ktree", n, 4 * cdiv(DIM, n)).cycles for s in specs]
        cells += [allreduce_cost(s, "ring", n, 4 * cdiv(DIM, n)).cycles for s in specs]
        cells += [line_alltoall_cost(s, n, 4 * DIM).cycles for s in specs]
        out.append(f"| {n} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    out += ["", "A torus halves a multicast's reach and makes the ring's neighbours one hop apart; its all-to-all's "
            "busiest link carries half the mesh's. A mesh-switch takes long routes through its ports: the all-to-all's "
            "longest route stops growing with n, but every port's switch link carries its group's long traffic.", "",
            "Emulated hop by hop on a torus and a mesh-switch (LoopFabric, 16-core tiles), next to the closed forms "
            "over the same topology:", "",
            "| line | topology | algorithm | emulated hops / stages / messages / link bytes / cycles | closed form | "
            "equal |", "|---|---|---|---|---|---|"]
    for n in (16, 64):
        mesh = MeshSpec(n, 1, 16, 1)
        x = np.ones((1, n, 32), np.float32)
        for t in TOPOLOGIES[1:]:
            spec = TINY.replace(topology=t)
            for algo in ("ktree", "ring"):
                _, cost = simulate(mesh, spec, mesh.region, lambda ctx, a, algo=algo: ctx.allreduce(a, "x", algo), a=x)
                got = cost[f"allreduce.{algo}"]
                want = allreduce_cost(spec, algo, n, 128) + compute_cost(spec, reduce_flops(algo, n, 32))
                g, w = (_counts(got), _counts(want))
                out.append(f"| 1x{n} | {t} | {algo} | {g} | {w} | {'yes' if g == w else 'NO'} |")
    return out + [""]


def _counts(c) -> tuple:
    return c.hops, c.stages, c.messages, c.link_bytes, round(c.cycles)


def training() -> list[str]:
    out = ["## 6. Training on paper: three strategies on every wafer template", "",
           "One optimizer step of 256 sequences of 2048 tokens, bfloat16 (`waferrt estimate --train`); seconds, "
           "tokens/s and model-flops utilisation of each strategy, what bounds it, and the planner's pick "
           "(throughput). docs/ESTIMATES.md \"Training\" says what the model leaves out.", ""]
    for name in ("llama3-8b", "smollm2-135m"):
        found = MODELS[name]
        out += [f"### {found.label}", "", "| template | weight streaming | pipeline | tensor-stream | pick |",
                "|---|---|---|---|---|"]
        for t in TEMPLATES.values():
            est = estimate_train(TrainJob(found.config, TrainShape(256, 2048), "bfloat16", found.label), t)
            cells = [f"{s.step_s:.3f} s, {s.tokens_per_s:,.0f} tok/s, MFU {s.mfu:.0%}, {s.breakdown.bound}"
                     if s.fits else "does not fit" for s in est.strategies]
            pick = est.chosen.strategy if est.chosen else "none"
            out.append(f"| {t.label()} | " + " | ".join(cells) + f" | {pick} |")
        out.append("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "scaling.md"))
    args = ap.parse_args()
    head = ["# Scaling to a whole wafer", "",
            "Generated by `python benchmarks/scaling.py`; do not edit by hand. Every figure comes from the "
            "closed forms that tests/unit/test_estimate_emulator.py ties to what the emulator books; "
            "docs/ESTIMATES.md says where the model simplifies.", ""]
    t0 = time.perf_counter()
    text = "\n".join(head + primitives() + emulated_primitives() + strategies() + emulated_decode() + topologies()
                     + training())
    Path(args.out).write_text(text + f"\n_Generated in {time.perf_counter() - t0:.0f} s._\n")
    print(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
