"""``waferrt estimate``: a model on a whole wafer, on paper -- the plan, the decode speed and its breakdown.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``add_workload_args(parser)`` and
``workload(args)`` are the arguments it shares with ``waferrt sweep`` (``--strategy`` takes the words of
``waferrt plan``, checked and read by the same code: ``waferrt.cli.strategy.strategy_text`` and
``waferrt.scheduler.strategies.parse_strategy``); ``run(args) -> int`` prints the estimate
(text, or ``--json``; for a mixture of experts with ``waferrt.estimator.moe_estimate``'s figures after it)
made by ``waferrt.estimator.estimate`` (closed forms, no emulation: seconds even for
a 750x994-core wafer), with ``--streaming`` the weight-streaming estimate next to it; with ``--train`` a training
step instead (``waferrt.cli.train_estimate.run_estimate``). Exit status: 0 it
fits (or streams), 1 it does not fit (the output says what would), 2 an argument is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from waferrt.core.dtypes import STORAGE_DTYPES
from waferrt.core.spec import PRESETS, spec_by_name
from waferrt.estimator.estimate import estimate
from waferrt.estimator.moe_estimate import moe_estimate
from waferrt.estimator.prefill import kernel_lines, prefill, published_lines
from waferrt.estimator.sparse_estimate import sparse_estimate
from waferrt.estimator.streaming import streaming
from waferrt.model.zoo import MODELS, model_by_name
from waferrt.scheduler.strategies import STRATEGY_HELP, parse_strategy
from waferrt.scheduler.types import OBJECTIVES, KVReserve, Objective

from .attention import attention_mode
from .common import MAX_REQUESTS, check_kv_tokens, parse_wxh, two_numbers, whole_number
from .strategy import strategy_text
from .train_estimate import add_train_args, run_estimate, train_job, train_objective

EPILOG = f"""examples:
  waferrt estimate --model llama3-8b                    Llama3-8B on a whole WSE-2 (float16, 4096 K/V tokens x 8)
  waferrt estimate --model qwen2-72b --preset wse3      does not fit: says what would
  waferrt estimate --model qwen2-72b --streaming        weights streamed in from off-wafer memory
  waferrt estimate --model llama3-8b --objective throughput --requests 32
  waferrt estimate --model llama3-8b --strategy tensor --requests 1
  waferrt estimate --model codellama-34b --strategy grouped:8 --dtype bfloat16 --json
  waferrt estimate --model llama3-8b --strategy grouped  the planner picks how many layers per region
  waferrt estimate --model path/to/model.gguf --mesh 200x200   any llama GGUF (metadata only)
  waferrt estimate --model llama3-8b --prompt-tokens 8192 --kv-tokens 8192 --pair 4096:256
  waferrt estimate --model mixtral-8x7b                 a mixture of experts: experts, all-to-all, what fits
  waferrt estimate --train --model llama3-8b --global-batch 256 --seq 2048   a training step, three strategies
  waferrt estimate --train --model smollm2-135m --template watos --topology torus --objective memory

Named models: {", ".join(sorted(MODELS))}. Strategies, as `waferrt plan`
and `waferrt generate` take them: layer (every layer its own region, tokens flow region to region),
tensor (one region runs every layer: WaferLLM's wafer-scale tensor parallelism), grouped:N (N layers per
region). Without --strategy, or with grouped alone, the planner tries them all (or every grouped one) and
picks by --objective (latency: time per token of one request; throughput: tokens/s with --requests in
flight) and says why.
Times are the emulator's own closed forms (tested equal to what its tiles book) plus the host's I/O;
docs/ESTIMATES.md says what the model leaves out.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "estimate", help="a model on a whole wafer, on paper: plan, tokens/s, breakdown, fit",
        description="Plan a Llama model on a whole wafer analytically and estimate its decode: time per token and "
                    "tokens/s for one request and for --requests in flight, the breakdown in seconds, cores and "
                    "SRAM used, K/V capacity -- or why it does not fit and what would.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    add_train_args(p)
    p.add_argument("--mesh", type=parse_wxh, metavar="WxH", help="cores to use (default: the whole wafer)")
    p.add_argument("--streaming", action="store_true", help="also estimate weight streaming from off-wafer memory")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.add_argument("--attention", type=attention_mode, metavar="MODE",
                   help="also time STAR's sparse attention (sparse:K or sparse:F) against dense: per context, where "
                        "it starts to pay, a token's time at --kv-tokens, the longest context that fits")
    p.add_argument("--prompt-tokens", type=whole_number(1, "4096"), metavar="N",
                   help="the prefill of an N-token prompt: tokens/s, breakdown, time to first token (default 4096, "
                        "at most --kv-tokens)")
    p.add_argument("--prefill-grid", type=whole_number(1, "720"), metavar="N",
                   help="the prefill's MeshGEMM grid: N x N cores inside the mesh (default: the mesh's largest square, "
                        "as WaferLLM gives its prefill the wafer)")
    p.add_argument("--pair", type=pair, default=None, metavar="IN:OUT",
                   help="an input/output pair timed end to end: prefill, then decode (default 2048:128, or "
                        "in the same proportion within a smaller --kv-tokens)")
    p.set_defaults(_run=run)
    return p


def add_workload_args(p) -> None:
    """What `estimate` and `sweep` both ask: model, base preset, strategy, objective, K/V reserve, dtype."""
    p.add_argument("--model", default="llama3-8b", help="a named model (see below) or a llama GGUF path")
    p.add_argument("--preset", choices=sorted(PRESETS), help="hardware preset (default wse2)")
    p.add_argument("--strategy", type=strategy_text, metavar="S", help=STRATEGY_HELP + "; default: the planner "
                   "tries every strategy and picks by --objective")
    p.add_argument("--objective", default="latency", choices=OBJECTIVES + ("memory",),
                   help="latency: one request's time per token; throughput: tokens/s with --requests in flight; "
                        "with --train: the shortest step (latency, throughput) or the least SRAM per core (memory)")
    p.add_argument("--kv-tokens", type=whole_number(1, "--kv-tokens 4096"),
                   help="K/V positions per request (default 4096, at most the model's context)")
    p.add_argument("--requests", type=whole_number(1, "--requests 8", MAX_REQUESTS),
                   help="requests in flight (default 8)")
    p.add_argument("--dtype", default="float16", choices=STORAGE_DTYPES, help="storage dtype (default float16)")


def workload(args):
    """(config, label, spec, the strategies to try or None for all, KVReserve) from add_workload_args'
    arguments; ValueError saying what to write for a --strategy the model cannot take (grouped:N, N too big)."""
    config, label = model_by_name(args.model)
    spec = spec_by_name(args.preset or "wse2")
    tried = parse_strategy(args.strategy, config.n_layers) if args.strategy else None
    if args.kv_tokens is not None:
        check_kv_tokens(args.kv_tokens, config, label)
    kv = KVReserve(args.kv_tokens or min(4096, config.max_seq_len), args.requests or 8)
    return config, label, spec, tried, kv


def pair(text: str) -> tuple[int, int]:
    """'2048:128' -> (2048, 128): prompt tokens and new tokens, both whole numbers >= 1 (argparse type)."""
    a, b = two_numbers(text, ":", "IN:OUT", "2048:128")
    if a < 1 or b < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: both token counts must be at least 1, e.g. 2048:128")
    return a, b


def _prompts(args, kv) -> tuple[int, tuple[int, int] | None]:
    """(prompt tokens, (in, out) or None) checked against the K/V reserve; the defaults shrink to fit it (no
    pair at all in a reserve of one position)."""
    tokens = args.prompt_tokens or min(4096, kv.tokens)
    if tokens > kv.tokens:
        raise ValueError(f"--prompt-tokens {tokens} is more than the {kv.tokens} K/V positions per request; "
                         f"give --kv-tokens {tokens} or a shorter prompt")
    if args.pair is None:
        out = min(128, kv.tokens // 17)
        return tokens, ((2048, 128) if kv.tokens >= 2176 else (kv.tokens - out, out) if out else None)
    n_in, n_out = args.pair
    if n_in + n_out > kv.tokens:
        raise ValueError(f"--pair {n_in}:{n_out} needs {n_in + n_out} K/V positions per request, more than "
                         f"the {kv.tokens} reserved; give --kv-tokens {n_in + n_out} or a shorter pair")
    return tokens, (n_in, n_out)


def run(args) -> int:
    if args.train:
        return run_estimate(args)
    train_job(args, "estimate")
    train_objective(args)
    try:
        config, label, spec, tried, kv = workload(args)
        mesh = args.mesh or spec.full_mesh
        tokens, io = _prompts(args, kv)
        est = replace(estimate(config, spec, mesh, kv, args.dtype, Objective(args.objective, tried)), label=label)
    except ValueError as e:
        print(f"waferrt estimate: {e}", file=sys.stderr)
        return 2
    if args.streaming:
        resident = est.tokens_per_s if est.fits else None
        est = _with(est, streaming(config, spec, mesh, kv, args.dtype, resident))
    out, text = est.to_json(), [est.text()]
    if est.fits and not config.moe:  # the prefill's closed forms know no experts yet
        try:
            pre = prefill(est, tokens, args.prefill_grid)
        except ValueError as e:
            print(f"waferrt estimate: {e}", file=sys.stderr)
            return 2
        out["prefill"], text = pre.to_json(), text + pre.lines() + published_lines(config, pre)
        if io is not None:
            (n_in, n_out), e2e = io, prefill(est, io[0], args.prefill_grid).end_to_end(io[1])
            out["prefill"]["end_to_end"] = {"in": n_in, "out": n_out, "seconds": e2e,
                                            "tokens_per_s": (n_in + n_out) / e2e, "new_tokens_per_s": n_out / e2e}
            text.append(f"end to end      {n_in} in, {n_out} out: {e2e * 1e3:.1f} ms = "
                        f"{(n_in + n_out) / e2e:,.0f} tokens/s ({n_out / e2e:,.0f} new tokens/s)")
    if not config.moe:
        text += kernel_lines(config, spec, args.prefill_grid or min(*mesh, config.dim), tokens, args.dtype)
    if est.fits and args.attention and not args.attention.dense:
        sp = sparse_estimate(est, args.attention)
        out["sparse"], text = sp.to_json(), text + sp.lines()
    if config.moe:
        moe = moe_estimate(est)
        out["moe"], text = moe.to_json(), text + [moe.text()]
    print(json.dumps(out, indent=1) if args.json else "\n".join(text))
    return 0 if est.fits or (est.streaming is not None and est.streaming.fits) else 1


def _with(est, stream):
    import dataclasses

    return dataclasses.replace(est, streaming=stream)
