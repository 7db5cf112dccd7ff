"""``waferrt chaos``: decode with and without a seeded campaign of faults, side by side, and compare.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` loads the model
(SmolLM2 by default, ``--model tiny`` for the small synthetic Llama), plans it, starts the tiles once, decodes
``--requests`` prompts fault-free, then again under a FaultPlan drawn from ``--seed`` (``--faults`` faults of
``--kinds``, on the cores, links, tile borders and tiles the decode uses, each at a step up to
``--max-new-tokens``; or ``--plan FILE``), and prints, per fault: kind, where, the step it fired at, what
detected it and how long after, how long recovery took (wall) and what it would cost on the modelled
wafer, and what was done; then ``identical: yes|no`` with the command that reproduces the run. Exit status
0 only when every request's tokens are identical (1 otherwise; 2 for a usage mistake). The model is planned as
``waferrt generate`` plans it (``--strategy``, ``--objective``, ``--streaming``). ``--nodes N`` starts N Ray
nodes on this machine (waferrt.actors.localcluster) and spreads the tiles over them, so that node losses
(kind ``node``, drawn over the worker nodes) can happen; everything the user gave is checked before they start.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from waferrt.core.spec import PRESETS
from waferrt.faults.model import KINDS, FaultKind
from waferrt.model.sparse import AttentionMode

from .common import (
    MAX_SEED,
    UsageError,
    check_context,
    checked_mesh,
    model_arg,
    not_a_file,
    output_path,
    parse_wxh,
    refuse_together,
    say,
    whole_number,
)
from .experts import add_experts_arg, check_experts_flags
from .strategy import add_strategy_args

TINY_MODELS = ("tiny", "tinymoe")  # synthetic models on the tiny spec
HELP = "inject a seeded campaign of faults into a decode and check nothing is lost"
DESCRIPTION = """\
Decode the same requests twice on the emulated wafer: fault-free, then under a seeded plan of injected
faults (dead cores and links, corrupted payloads, stragglers, crashed tile actors). The run recovers from
each (re-plan onto spare cores, restart the dead tiles, weights again from the host, replay the requests)
and the tokens must come out identical. Per fault it prints what found it, how fast, and what recovery cost.
With --nodes N the tiles spread over N Ray nodes started on this machine, and whole nodes can be lost too."""
EPILOG = """\
examples:
  waferrt chaos --faults 20 --kinds core,link,corrupt,straggler,tile --seed 1
  waferrt chaos --model tiny --faults 5 --seed 3 --json        the small synthetic model: seconds
  waferrt chaos --save-plan plan.yaml --faults 8               draw a plan, keep it, run it
  waferrt chaos --plan plan.yaml                               replay a plan from a file
  waferrt chaos --policy fail-fast --faults 1                  the first fault ends the run (exit 1)
  waferrt chaos --model tiny --nodes 3 --faults 6              three Ray nodes; node losses drawn too
  waferrt chaos --model tiny --streaming --mesh 32x16 --tile 16x16   weight streaming: the region moves

Fault kinds: core (a core dies: its SRAM is gone), link (a link between two cores drops everything),
corrupt (bit flips on a link between two tiles: caught by the payload checksum), straggler (a tile slows
down: slow, not dead), tile (a tile actor's process exits), node (a Ray node goes away with its tiles:
needs --nodes 2 or more; never node 0, which runs this driver). By default every kind the run can have is
drawn. Steps count the micro-batches a tile runs after the plan is armed. The --nodes are ray.cluster_utils
nodes in a temp dir of their own: a Ray already running on the machine is neither joined nor stopped."""

MAX_FAULTS = 1000  # a campaign's faults (each is armed on its tiles and logged)
MAX_NODES = 8  # each a raylet (and the head a GCS) on this machine
PROMPTS = ("The capital of France is", "Once upon a time, there was a", "def fibonacci(n):",
           "The three primary colours are", "Water boils at", "My favourite book is", "import numpy as np",
           "The opposite of hot is")


def kinds(text: str) -> tuple[FaultKind, ...]:
    got = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in got if k not in KINDS]
    if bad or not got:
        raise argparse.ArgumentTypeError(f"{text!r}: fault kinds are a comma-separated list of {','.join(KINDS)}")
    return tuple(FaultKind(k) for k in got)


def node_count(text: str) -> int:
    n = whole_number(1, "--nodes 3")(text)
    if n > MAX_NODES:
        raise argparse.ArgumentTypeError(f"{n} Ray nodes on one machine is too many: at most {MAX_NODES} "
                                         "(each is a raylet of its own); e.g. --nodes 3")
    return n


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("chaos", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=whole_number(1, "--faults 20", MAX_FAULTS), metavar="N",
                   help="faults to draw (20)")
    p.add_argument("--seed", type=whole_number(0, "--seed 1", MAX_SEED), help="the campaign's seed (0)")
    p.add_argument("--kinds", type=kinds, metavar="K,K",
                   help=f"fault kinds to draw from ({','.join(KINDS)}; default: all but node, and node too with "
                        "--nodes 2 or more)")
    p.add_argument("--nodes", type=node_count, metavar="N",
                   help="start N Ray nodes on this machine and spread the tiles over them (default 1; 3 when --kinds "
                        "has node or a --plan loses a node)")
    p.add_argument("--max-new-tokens", type=whole_number(1, "--max-new-tokens 16"), default=16, metavar="T",
                   help="tokens per request (16); faults fire at steps 1..T")
    p.add_argument("--requests", type=whole_number(1, "--requests 4"), default=4, metavar="R",
                   help=f"requests decoded together (4, at most {len(PROMPTS)})")
    p.add_argument("--plan", metavar="FILE", help="run this FaultPlan (.json/.yaml) instead of drawing one")
    p.add_argument("--save-plan", type=output_path("plan.yaml"), metavar="FILE",
                   help="write the plan that runs to FILE (.json/.yaml)")
    p.add_argument("--policy", choices=("tolerant", "fail-fast"), help="override the plan's policy")
    p.add_argument("--model", type=model_arg(*TINY_MODELS), default="smollm2",
                   help="'smollm2' (default), 'tiny' (a small synthetic Llama: fast), 'tinymoe' (the same with "
                        "each FFN a mixture of 4 experts, 2 per token) or a Llama GGUF path")
    p.add_argument("--mesh", type=parse_wxh, metavar="WxH", help="mesh size in cores (default: fitted)")
    p.add_argument("--tile", type=parse_wxh, metavar="TWxTH", help="tile size in cores (with --mesh)")
    p.add_argument("--spec", default=None, choices=sorted(PRESETS), help="hardware spec (wse2; tiny for --model tiny)")
    add_strategy_args(p)
    add_experts_arg(p)
    p.add_argument("--streaming", action="store_true",
                   help="weight streaming, as waferrt generate --streaming (a dead core or link moves the region when "
                        "the mesh has room: give a --mesh of two tiles)")
    p.add_argument("--prefill", action="store_true",
                   help="prefill whole prompts by MeshGEMM, as waferrt generate --prefill (faults fire in both phases)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # what generate's planning and prompt reading take that chaos does not offer: dense attention, float32, this machine
    p.set_defaults(_run=run, dtype="float32", address=None, no_cache=False, chat=False, system=None,
                   attention=AttentionMode())
    return p


def run(args) -> int:
    import contextlib

    from waferrt.actors.localcluster import LocalCluster
    from waferrt.model import Sampler

    _check(args)
    config, weights, requests, place, decode = _model(args)
    check_experts_flags(args, config)
    sampler = Sampler()
    if args.nodes > 1:
        say(f"starting {args.nodes} Ray nodes on this machine (ray.cluster_utils): the tiles spread over them")
    with LocalCluster(args.nodes) if args.nodes > 1 else contextlib.nullcontext() as cluster:
        placement = place(cluster.node_infos() if cluster else None)
        _check_plan_on(args, placement.mesh)
        llm = _wafer_llm(config, placement, cluster.address if cluster else None, args.prefill)
        with llm.open(progress=say):
            llm.load(weights(), progress=say)
            plan = _plan(args, llm)
            say(f"fault-free decode of {len(requests)} requests x {args.max_new_tokens} tokens")
            want, _ = llm.generate(requests, sampler)
            say(f"the same under {len(plan.faults)} faults (seed {plan.seed}, policy {plan.policy})")
            lose = None if cluster is None else (lambda i: cluster.remove(llm.placement.nodes[i].name))
            with llm.faults(plan, node_loss=lose) as session:
                try:
                    got, error = llm.generate(requests, sampler)[0], None
                except Exception as e:  # noqa: BLE001 - reported: what could not be recovered, with the tokens so far
                    got, error = getattr(e, "completions", []), e
    outcome = _Outcome(tuple(want), tuple(got), error)
    _report(args, plan, session.log, outcome, decode)
    return 0 if outcome.same else 1


def _check(args) -> None:
    """--requests, --kinds and --nodes together (each alone was checked by its type): UsageError, before Ray."""
    from waferrt.faults import FaultPlan, NodeLoss

    if args.requests > len(PROMPTS):
        raise UsageError(f"--requests {args.requests}: at most {len(PROMPTS)} (the built-in prompts)")
    refuse_together(args, "--plan", ("--faults", "--seed", "--kinds"), "the --plan file says which faults strike "
                    "where and when; leave those out, or leave out --plan to draw a campaign")
    args.faults, args.seed = 20 if args.faults is None else args.faults, args.seed or 0
    if args.plan:
        if os.path.exists(args.plan) and not_a_file(args.plan):  # a device or a pipe would be read forever
            raise UsageError(f"--plan {args.plan}: it {not_a_file(args.plan)}; give a fault plan file (.json or "
                             ".yaml), e.g. one written by --save-plan")
        try:
            args.plan_given = FaultPlan.load(args.plan)
        except OSError as e:
            raise UsageError(f"--plan {args.plan}: cannot read it: {e.strerror}; give a fault plan file (.json or "
                             ".yaml), e.g. one written by --save-plan") from None
        except ValueError as e:
            raise UsageError(f"--plan {args.plan}: {e}") from None
    lost = max((f.node for f in args.plan_given.faults if isinstance(f, NodeLoss)), default=0) if args.plan else 0
    drawn = args.kinds is not None and FaultKind.NODE in args.kinds
    least = max(lost + 1, 2 if drawn else 1)  # node 0 runs this driver and is never lost
    if args.nodes is None:
        args.nodes = max(least, 3) if least > 1 else 1
    elif lost >= args.nodes:
        raise UsageError(f"--plan {args.plan} loses Ray node {lost}, but --nodes {args.nodes} starts nodes "
                         f"0..{args.nodes - 1} (0 runs this driver): give --nodes {lost + 1} or more")
    elif args.nodes < least:
        raise UsageError("--kinds node: a node loss needs several Ray nodes (node 0 runs this driver and is never "
                         "lost); give --nodes 3, or leave node out of --kinds")
    args.kinds = args.kinds or (KINDS if args.nodes > 1 else tuple(k for k in KINDS if k is not FaultKind.NODE))


def _wafer_llm(config, placement, address, prefill: bool):
    """The planned WaferLLM (prompts prefilled by MeshGEMM with `prefill`), or UsageError when the decode cannot
    run on these tiles (a region over two) or so."""
    from dataclasses import replace

    from waferrt.decode.setup import PlacementError
    from waferrt.llm import LLM_LAUNCH, WaferLLM

    try:
        return WaferLLM(config, None, placement, launch=replace(LLM_LAUNCH, address=address)).use_prefill(prefill)
    except PlacementError as e:
        raise UsageError(str(e)) from None


def _check_plan_on(args, mesh) -> None:
    """--plan's faults lie on the mesh the model was placed on (before the tiles start): UsageError otherwise."""
    if args.plan:
        try:
            args.plan_given.check(mesh)
        except ValueError as e:
            raise UsageError(f"--plan {args.plan}: {e}; give a --mesh that holds it, or edit the plan") from None


def _model(args):
    """(config, weights() -> the float32 weights, requests, place(nodes) -> Placement, decode(tokens) -> text)
    for --model; what can be checked without Ray (the mesh, the model file, the prompts) is checked here."""
    from waferrt.core.mesh import Extent, MeshSpec
    from waferrt.serving import GenRequest

    from . import placing
    from .model import open_model, prompt_requests, ready_weights

    if args.model in TINY_MODELS:
        from waferrt.model import synthetic_llama, tiny_config, tiny_moe_config

        config = tiny_config() if args.model == "tiny" else tiny_moe_config(n_experts=4, top_k=2)
        args.spec, args.kv_tokens, args.max_tiles = args.spec or "tiny", 32 + args.max_new_tokens, 64
        requests = [GenRequest(tuple(range(3 + i, 8 + 2 * i)), args.max_new_tokens) for i in range(args.requests)]
        check_context(requests, config)
        mesh = checked_mesh(args, lambda size: Extent(8, 8)) or (None if args.streaming else MeshSpec(16, 16, 8, 8))
        return (config, lambda: synthetic_llama(config, seed=0), requests,
                lambda nodes: placing.placement(args, config, mesh, requests, nodes), str)
    args.spec, args.kv_tokens, args.max_tiles = args.spec or "wse2", 64 + args.max_new_tokens, 64
    mesh = checked_mesh(args, lambda size: size)
    model, tok = open_model(args)
    requests = prompt_requests(args, tok, list(PROMPTS[:args.requests]))
    check_context(requests, model.config)
    return (model.config, lambda: ready_weights(model), requests,
            lambda nodes: placing.placement(args, model.config, mesh, requests, nodes),
            lambda ids: tok.decode(ids, skip_special=True))


def _plan(args, llm):
    """The plan to run: --plan's, or drawn from --seed over what the decode uses."""
    import dataclasses

    if args.plan:
        plan = args.plan_given  # loaded and checked before Ray started
    else:
        plan = draw_plan(llm, args.seed, args.faults, args.kinds, args.nodes, args.max_new_tokens)
    if args.policy:
        plan = dataclasses.replace(plan, policy=args.policy)
    if args.save_plan:
        plan.save(args.save_plan)
    return plan


def draw_plan(llm, seed: int, n: int, kinds: tuple[FaultKind, ...], nodes: int, steps: int):
    """A FaultPlan of `n` faults of `kinds` drawn from `seed` over what the decode of `llm` uses (its cores,
    the tile borders its micro-batches cross, `nodes` Ray nodes), each at a step up to `steps`; UsageError
    when nothing is left to draw (also for ``waferrt serve --chaos``)."""
    from waferrt.decode.program import crossings
    from waferrt.faults import FaultPlan, Targets
    from waferrt.faults.model import border_links

    p = llm.placement
    cores = {c for _, r in p.regions() for c in r.cores()} - p.mesh.dead
    cross = crossings(llm.setup)  # the tile borders the decode's micro-batches cross: where Corrupt can strike
    links = border_links(p.mesh, cross) if cross else []
    if FaultKind.CORRUPT in kinds and not links and len(kinds) > 1:
        say("no corrupt faults drawn: every stage runs on one tile, so no payload crosses a tile border")
    try:
        return FaultPlan.random(seed, n, Targets(p.mesh, cores, links, nodes), kinds, steps)
    except ValueError as e:  # nothing left to draw: corrupt alone where no payload crosses a tile border
        raise UsageError(f"--kinds {','.join(kinds)}: {e}") from None


def _again(args, plan) -> str:
    """The command that runs this campaign again."""
    parts = ["waferrt chaos", f"--model {args.model}"]
    parts += [f"--plan {args.plan}"] if args.plan else [f"--faults {args.faults}", f"--seed {plan.seed}",
                                                         f"--kinds {','.join(args.kinds)}"]
    parts += [f"--max-new-tokens {args.max_new_tokens}", f"--requests {args.requests}"]
    parts += [f"--{k} {v}" for k, v in (("policy", args.policy), ("spec", args.spec), ("strategy", args.strategy),
                                         ("objective", args.objective), ("experts", args.experts),
                                         ("balance", args.balance)) if v]
    parts += [f"--nodes {args.nodes}"] if args.nodes > 1 else []
    parts += ["--streaming"] if args.streaming else []
    parts += ["--prefill"] if args.prefill else []
    parts += [f"--{k} {v.width}x{v.height}" for k, v in (("mesh", args.mesh), ("tile", args.tile)) if v]
    return " ".join(parts)


@dataclass(frozen=True, eq=False)
class _Outcome:
    """The fault-free decode's completions, the faulty one's (those so far, when it failed) and its error."""

    want: tuple
    got: tuple
    error: BaseException | None = None

    @property
    def same(self) -> bool:
        """Did the decode under faults recover to the fault-free tokens?"""
        return self.error is None and [c.tokens for c in self.got] == [c.tokens for c in self.want]


def _report(args, plan, log, outcome: _Outcome, decode) -> None:
    same, error, want, got = outcome.same, outcome.error, outcome.want, outcome.got
    counts = log.counts()
    again = _again(args, plan)
    if args.json:
        print(json.dumps({"identical": same, "seed": plan.seed, "policy": plan.policy, **counts,
                          "error": None if error is None else f"{type(error).__name__}: {error}", "again": again,
                          "faults": log.as_dicts()}))
        return
    print(log.table())
    for i, (w, g) in enumerate(zip(want, got)):
        if w.tokens != g.tokens:
            print(f"--- request {i} differs:\n  fault-free: {decode(w.tokens)!r}\n  with faults: {decode(g.tokens)!r}")
    if error is not None:
        print(f"not recovered: {type(error).__name__}: {error}")
    print(f"{counts['injected']} injected, {counts['fired']} fired, {counts['detected']} detected, "
          f"{counts['recovered']} recovered")
    print(f"identical: {'yes' if same else 'no'} (seed {plan.seed}; to reproduce: {again})")
