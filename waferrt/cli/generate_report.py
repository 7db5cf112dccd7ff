"""What ``waferrt generate`` says when the decode is done: the --json object or the summary line, the run's
bound, the trace and heatmap it wrote.

Contract: ``report(args, tok, out, stats, mesh, bound)`` prints the run (one JSON object with --json: the
fields waferrt.cli.generate's help lists); ``run_bound(placement, out)`` is the bound of the modelled rate of
what ran (scheduler.speed.run_bound_tokens_per_s at its tokens' positions); ``pictures(args, placement,
stats)`` writes --heatmap and says where --trace and --heatmap went.
"""

from __future__ import annotations

import json

from .attention import attention_json
from .common import say


def run_bound(placement, out) -> float | None:
    """The bound of the modelled rate of what ran (scheduler.speed.run_bound_tokens_per_s): as many requests in
    flight as ran, at the positions their tokens held, in micro-batches of at most serving.most_items (an MoE
    layer's tokens share their micro-batch's routed work); None for --streaming or when nothing was
    generated."""
    from waferrt.scheduler.speed import run_bound_tokens_per_s
    from waferrt.serving import logit_positions, most_items

    positions = logit_positions(out)
    if placement.streaming or not positions:
        return None
    return run_bound_tokens_per_s(placement, min(len(out), placement.kv.requests), positions, most_items(out))


def pictures(args, placement, stats) -> None:
    """--trace (written by the decode) and --heatmap: say where they are."""
    if args.trace:
        say(f"trace: {args.trace} (open it in ui.perfetto.dev: a track per tile and the host, and the modelled "
            "wafer's schedule)")
    if args.heatmap:
        from waferrt.cli.heatmap import Measured, heatmap_png

        t = stats.trace
        heatmap_png(placement, args.heatmap, Measured(stats.runs, t.busy_s(), t.sent_bytes(), t.wall_s()))
        say(f"heatmap: {args.heatmap}")


def first_token(stats, out, pick) -> dict:
    """The --json fields of the time to first token: wall and modelled seconds, and the prefill's modelled
    tokens/s (the prompt's tokens over its modelled time to first token), per request."""
    n = range(len(out))
    rate = stats.prefill_tokens_per_s({i: len(c.prompt_ids) for i, c in enumerate(out)})
    return {"ttft_wall_s": pick([stats.ttft_wall_s.get(i) for i in n]),
            "ttft_modelled_s": pick([stats.ttft_modelled_s.get(i) for i in n]),
            "prefill_tokens_per_s": pick([rate.get(i) for i in n])}


def report(args, tok, out, stats, mesh, bound) -> None:
    gen = [tok.decode(c.tokens, skip_special=True) for c in out]
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
            "mesh": mesh, "expert_swaps": stats.expert_swaps, **first_token(stats, out, pick),
            **attention_json(args, args.agreement)}))
        return
    wafer = "" if mesh == "reference" else f"; modelled wafer: ran {stats.wafer_tokens_per_s:,.0f} tok/s" + (
        "" if bound is None else f", bound {bound:,.0f} tok/s")
    swaps = "" if stats.expert_swaps is None else f"; NI-Balancer swapped experts {stats.expert_swaps} times"
    say(f"{stats.tokens} tokens in {stats.wall_s:.2f}s: wall {stats.wall_tokens_per_s:.1f} tok/s{wafer}{swaps}")
