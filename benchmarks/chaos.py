"""A seeded fault campaign: many decode runs, each under its own drawn FaultPlan, all six fault kinds.

    python benchmarks/chaos.py                      # 40 runs x 5 faults = 200 faults, tiny model, 3 Ray nodes
    python benchmarks/chaos.py --runs 8 --faults 3  # a quick look

It starts three Ray nodes on this machine (``waferrt.actors.localcluster``: ``ray.cluster_utils``, a private
temp dir, never the machine's other Rays) so that node losses can happen (the driver's node, 0, is never
drawn), plans the tiny model over them, decodes the same requests fault-free once, then run after run under
``FaultPlan.random(seed + run, ...)`` over what the decode uses (its cores, links, tile borders, tiles and
worker nodes). What died stays dead from run to run (the state a later recovery meets matters) until a run
ends in NoRoom (no room left to re-plan the model around what died: the expected end of a wafer); the next run
then starts on a new wafer. A node that was lost is added back after its run and the next run starts on a
wafer planned over the three nodes again, around the cores and links that died (a lost node's tiles were
restarted on the others: without this, later node losses would find no tile to take). Each run has a
wall-clock deadline: a run that passes it counts as a hang (and ends the campaign; every thread's stack and the
fault log are printed). It prints per run one line, then: faults injected / fired / detected / recovered, runs
identical to the fault-free tokens, with wrong tokens, hangs, runs not recovered, runs that used the wafer up,
and the recovery cost (detection latency, wall seconds to recover, modelled wafer seconds of the weights sent
again), by kind.
"""

from __future__ import annotations

import argparse
import faulthandler
import statistics
import sys
import threading
import time

RUN_DEADLINE_S = 180.0
NO_ROOM = "no room"  # a run that ended in NoRoom: the faults so far left no room for the model (expected)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--faults", type=int, default=5, help="faults per run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=3, help="Ray nodes (1: no node losses)")
    ap.add_argument("--first", type=int, default=0, help="start at this run (to replay one: --first N --runs 1)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every run's fault log (where, step, "
                                                                 "what found each fault, what recovery did)")
    args = ap.parse_args()
    from waferrt.actors.localcluster import LocalCluster

    with LocalCluster(args.nodes) as cluster:  # its own temp dir: never the machine's other Rays
        return _campaign(args, cluster)


def _campaign(args, cluster) -> int:
    from waferrt.model import Sampler, synthetic_llama, tiny_config
    from waferrt.serving import GenRequest

    config, weights = tiny_config(), synthetic_llama(tiny_config(), seed=0)
    requests = [GenRequest((5, 6, 7), 12), GenRequest((100, 3), 9), GenRequest((9,), 14)]
    sampler = Sampler(temperature=0.8, top_p=0.9, seed=5)
    events, outcomes, llm, want, dead = [], [], None, None, None
    try:
        for run in range(args.first, args.first + args.runs):
            if llm is None:  # the first wafer, a new one after NoRoom, or one over the nodes restored
                llm = _wafer(config, weights, cluster, dead)
                want = want or [c.tokens for c in llm.generate(requests, sampler)[0]]
            plan_ = _draw(args, run, llm)
            t0 = time.monotonic()
            outcome, log = _run(llm, plan_, cluster, requests, sampler, want)
            outcomes.append(outcome)
            events += log.events
            print(f"run {run:3d} seed {plan_.seed}: {outcome:<12} {time.monotonic() - t0:6.1f} s  "
                  + ", ".join(f"{e.kind}:{e.outcome}" for e in log.events), flush=True)
            if args.verbose:
                print(log.table())
            if outcome == "hang":
                break
            dead = None if outcome == NO_ROOM else (llm.placement.mesh, llm.placement.dead_links)
            if cluster.restore() or outcome == NO_ROOM:
                print("    the wafer has no room left for the model: the next run starts on a new one" if dead is None
                      else "    a node was lost: the next run re-plans the wafer over the nodes there are again "
                           "(what died stays dead)")
                llm.close()
                llm = None
    finally:
        if llm is not None:
            llm.close()
    _summary(events, outcomes)
    return 0 if all(o == "identical" for o in outcomes) else 1


def _wafer(config, weights, cluster, dead):
    """A wafer planned over the cluster's nodes as they are now, around `dead` (the mesh with its dead cores and
    the dead links of the last wafer; None: a whole new mesh) when the model still fits around them with every
    region inside one tile (the decode's rule)."""
    from dataclasses import replace

    from waferrt.core.mesh import MeshSpec
    from waferrt.core.spec import TINY
    from waferrt.decode.setup import PlacementError
    from waferrt.llm import LLM_LAUNCH, WaferLLM
    from waferrt.scheduler import KVReserve, PlanError, PlanOptions, plan

    def planned(mesh, links):
        placement = plan(config, TINY, mesh, kv=KVReserve(48, 3),
                         options=PlanOptions(nodes=cluster.node_infos(), dead_links=links))
        launch = replace(LLM_LAUNCH, address=cluster.address)
        return WaferLLM(config, weights, placement, launch=launch)  # refuses a region across tiles

    try:
        llm = planned(*(dead or (MeshSpec(24, 16, 8, 8), frozenset())))
    except (PlanError, PlacementError):  # what died leaves no room for a new plan either: a new mesh
        print("    no room around what died: the next run starts on a new wafer")
        llm = planned(MeshSpec(24, 16, 8, 8), frozenset())
    return llm.open()


def _draw(args, run: int, llm):
    from waferrt.decode.program import crossings
    from waferrt.faults import KINDS, FaultPlan
    from waferrt.faults.model import Targets, border_links

    p = llm.placement
    cores = {c for _, r in p.regions() for c in r.cores()} - p.mesh.dead
    where = Targets(p.mesh, cores, border_links(p.mesh, crossings(llm.setup)), args.nodes)
    return FaultPlan.random(args.seed * 1000 + run, args.faults, where, KINDS, 10)


def _run(llm, plan_, cluster, requests, sampler, want):
    """One run under `plan_` in a thread with a deadline: (identical | wrong tokens | no room | unrecovered | hang,
    log)."""
    from waferrt.faults.errors import NoRoom

    result = {}

    def go():
        try:
            result["got"] = [c.tokens for c in llm.generate(requests, sampler)[0]]
        except Exception as e:  # noqa: BLE001 - counted as not recovered, with its cause printed
            result["error"] = e

    def node_loss(i: int) -> None:  # NodeLoss(i): the placement's i-th node
        cluster.remove(llm.placement.nodes[i].name)

    with llm.faults(plan_, node_loss=node_loss) as session:
        t = threading.Thread(target=go, daemon=True)
        t.start()
        t.join(RUN_DEADLINE_S)
        if t.is_alive():  # where it waits, for the report
            faulthandler.dump_traceback(all_threads=True)
            print(session.log.table())
            return "hang", session.log
    if "error" in result:
        e = result["error"]
        print(f"    not recovered: {type(e).__name__}: {str(e)[:300]}")
        return NO_ROOM if isinstance(e, NoRoom) else "unrecovered", session.log
    return ("identical" if result["got"] == want else "wrong tokens"), session.log


def _summary(events, outcomes) -> None:
    fired = [e for e in events if e.fired_at is not None]
    print(f"\n{len(outcomes)} runs: {outcomes.count('identical')} identical, {outcomes.count('wrong tokens')} "
          f"with wrong tokens, {outcomes.count('unrecovered')} not recovered, {outcomes.count('hang')} hangs, "
          f"{outcomes.count(NO_ROOM)} ended in NoRoom (the wafer used up: the next run on a new one)")
    print(f"faults: {len(events)} injected, {len(fired)} fired, "
          f"{sum(e.detected_at is not None for e in fired)} detected, "
          f"{sum(e.recovered_at is not None for e in fired)} recovered")
    print(f"\n{'kind':<10}{'fired':>6}{'detected after s (median/max)':>32}{'recovered in s (median/max)':>30}"
          f"{'modelled ms (mean)':>20}")
    for kind in sorted({e.kind for e in fired}):
        es = [e for e in fired if e.kind == kind]
        det = [e.detected_after_s for e in es if e.detected_after_s is not None]
        rec = [e.recovered_in_s for e in es if e.recovered_in_s is not None]
        print(f"{kind:<10}{len(es):>6}{_mm(det):>32}{_mm(rec):>30}"
              f"{statistics.fmean(e.modelled_s for e in es) * 1e3:>20.3f}")


def _mm(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} / {max(xs):.2f}" if xs else "-"


if __name__ == "__main__":
    sys.exit(main())
