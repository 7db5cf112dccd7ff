"""``waferrt bench``: a load run against ``waferrt serve`` (or any OpenAI-compatible server), its numbers printed
and written as JSON.

Contract: ``add_options(parser)`` registers the options (``benchmarks/serve.py`` takes the same ones) and
``run(args)`` sends ``--num-prompts`` streamed completions (their prompts drawn from a seed with the model's
own tokenizer, ``--input-len``/``--output-len``/``--range-ratio``, or read from ``--prompts``), at gamma
arrivals (``--request-rate``, inf by default, ``--burstiness``), at most ``--max-concurrency`` at once, to
``--base-url`` (this machine unless written there), and prints :func:`table` of the
:class:`waferrt.serving.stats.Summary`; ``--save-result PATH`` writes it as JSON (a temporary file then a
rename), with each request's text, finish reason and token counts. Ctrl-C prints and saves what completed,
then exits 130. Exit 1 when a request failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from waferrt.serving.stats import Latencies, Slo, Summary, summarize
from waferrt.serving.workload import Arrivals, Lengths, Shape, draw_requests

from .common import UsageError, model_path, output_path, prompt_file, whole_number

EXAMPLES = """\
examples (a server first: waferrt serve):
  waferrt bench --num-prompts 20 --request-rate 2          Poisson arrivals, 2 a second
  waferrt bench --request-rate inf --max-concurrency 4     all at once, 4 in flight
  waferrt bench --slo ttft:2000,tpot:500 --save-result r.json   goodput, and the numbers as JSON"""


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"--request-rate is requests per second (> 0) or inf, not {text!r}")
    return rate


def _ratio(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        r = -1.0
    if not 0 <= r < 1:
        raise argparse.ArgumentTypeError(f"--range-ratio is in [0, 1) (0.5: lengths from half to 1.5 times), "
                                         f"not {text!r}")
    return r


def _positive(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"give a positive number, not {text!r}")
    return x


def _slo(text: str) -> Slo:
    try:
        return Slo.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _base_url(text: str) -> str:
    """--base-url as written: http(s)://HOST[:PORT] (any host: the user wrote it)."""
    from .loadgen import check_base_url

    try:
        return check_base_url(text, explicit=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", type=_base_url, default=None, metavar="URL",
                   help="the server (default http://127.0.0.1:8000; a host off this machine only when written here)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", type=model_path, default="smollm2",
                   help="the model whose tokenizer makes the prompts ('smollm2' or a GGUF path)")
    p.add_argument("--served-model-name", default=None, metavar="NAME", help="default: the first of /v1/models")
    p.add_argument("--num-prompts", type=whole_number(1, "--num-prompts 20", 100_000), default=20, metavar="N")
    p.add_argument("--input-len", type=whole_number(1, "--input-len 32", 100_000), default=32, metavar="N",
                   help="prompt tokens (mean)")
    p.add_argument("--output-len", type=whole_number(1, "--output-len 16", 100_000), default=16, metavar="N",
                   help="tokens asked of each request (mean)")
    p.add_argument("--range-ratio", type=_ratio, default=0.0, metavar="R",
                   help="lengths uniform in [len*(1-R), len*(1+R)] (default 0)")
    p.add_argument("--prompts", type=prompt_file, default=None, metavar="FILE",
                   help="a UTF-8 file, one prompt a line (used in turn), instead of drawn prompts")
    p.add_argument("--request-rate", type=_rate, default=math.inf, metavar="R",
                   help="requests per second, or inf (default): every request at once")
    p.add_argument("--burstiness", type=_positive, default=1.0, metavar="B",
                   help="the gamma shape of the gaps: 1 Poisson (default), < 1 burstier")
    p.add_argument("--max-concurrency", type=whole_number(1, "--max-concurrency 8", 10_000), default=None,
                   metavar="N")
    p.add_argument("--seed", type=whole_number(0, "--seed 0"), default=0)
    p.add_argument("--slo", type=_slo, default=Slo(), metavar="ttft:MS,tpot:MS",
                   help="objectives for goodput (ttft, tpot, e2el in ms)")
    p.add_argument("--timeout", type=_positive, default=300.0, metavar="S", help="one request (default 300 s)")
    p.add_argument("--deadline", type=_positive, default=1800.0, metavar="S", help="the whole run (default 1800 s)")
    p.add_argument("--save-result", type=output_path("result.json"), default=None, metavar="PATH")


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="a load run against waferrt serve: TTFT, TPOT, ITL, throughput, goodput",
                       description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p)
    p.set_defaults(_run=run)


def prompts(args):
    """The run's prompts (waferrt.cli.loadgen.Prompt), from --prompts or drawn with the model's tokenizer."""
    from waferrt.model import Tokenizer, load_meta

    from .loadgen import Prompt

    out_shape = Lengths(args.output_len, args.range_ratio)
    if args.prompts:
        import numpy as np
        outs = out_shape.draw(args.num_prompts, np.random.default_rng([args.seed, 2]))
        return tuple(Prompt(args.prompts[i % len(args.prompts)], int(n)) for i, n in enumerate(outs))
    tok = Tokenizer(load_meta(None if args.model == "smollm2" else args.model)[1])
    vocab = range(max(tok.special_ids, default=-1) + 1, tok.vocab_size)
    shape = Shape(Lengths(args.input_len, args.range_ratio), out_shape, vocab)
    drawn = draw_requests(shape, args.num_prompts, args.seed)
    # ids -> text -> ids cut to the length drawn -> text (vLLM's way): a prompt of about the length drawn;
    # what the server counted comes back in usage.prompt_tokens
    return tuple(Prompt(tok.decode(tok.encode(tok.decode(d.prompt_ids))[:len(d.prompt_ids)]), d.max_tokens)
                 for d in drawn)


def target(args):
    from .loadgen import DEFAULT_BASE_URL, Target, check_base_url

    try:
        url = check_base_url(args.base_url or DEFAULT_BASE_URL, explicit=args.base_url is not None)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return Target(url, args.api_key, args.served_model_name, args.timeout)


def measure(args):
    """Send the run; returns (the loadgen Run, its Summary)."""
    from .loadgen import NoServer, Plan, run_load

    ps = prompts(args)
    offsets = Arrivals(args.request_rate, args.burstiness).offsets(len(ps), args.seed)
    plan = Plan(ps, tuple(float(t) for t in offsets), args.max_concurrency, args.deadline)
    try:
        run = run_load(target(args), plan)
    except NoServer as e:
        raise UsageError(str(e)) from None
    sent = [run.sent[i] for i in sorted(run.sent)]
    return run, summarize([s.outcome for s in sent], max(run.duration_s, 1e-9), args.slo)


def _rows(name: str, lat: Latencies | None) -> list[str]:
    if lat is None:
        return [f"{name}: none reported"]
    out = []
    for metric in ("ttft", "tpot", "itl", "e2el"):
        s = getattr(lat, metric)
        if s is None:
            out.append(f"  {metric.upper():5s} {name:8s} none reported")
            continue
        out.append(f"  {metric.upper():5s} {name:8s} mean {s.mean_ms:10.2f}  median {s.median_ms:10.2f}  "
                   f"p90 {s.p90_ms:10.2f}  p99 {s.p99_ms:10.2f}  ms")
    return out


def table(s: Summary) -> str:
    lines = [f"completed {s.completed}, failed {s.failed} in {s.duration_s:.2f} s",
             f"request throughput {s.request_throughput:.3f} req/s, output {s.output_throughput:.2f} tok/s, "
             f"total {s.total_token_throughput:.2f} tok/s ({s.total_input_tokens} in, {s.total_output_tokens} out)"]
    if s.request_goodput is not None:
        lines.append(f"goodput {s.request_goodput:.3f} req/s (requests meeting every SLO)")
    lines += _rows("wall", s.wall) + _rows("modelled", s.modelled)
    lines += [f"  failed: {e}" for e in s.errors[:5]]
    return "\n".join(lines)


def save_json(path: str, data: dict) -> None:
    """Write `data` to `path` whole (waferrt.core.files: a temporary file, fsynced, renamed)."""
    from waferrt.core.files import WriteError, atomic_open

    try:
        with atomic_open(path) as f:
            json.dump(data, f, indent=1)
    except WriteError as e:
        raise UsageError(str(e)) from None


def result_json(args, run, s: Summary) -> dict:
    config = {k: getattr(args, k) for k in ("num_prompts", "input_len", "output_len", "range_ratio",
                                            "request_rate", "burstiness", "max_concurrency", "seed")}
    config["request_rate"] = str(config["request_rate"])
    sent = [{"index": i, "text": v.text, "finish": v.finish, "max_tokens": v.max_tokens,
             "prompt_tokens": v.outcome.prompt_tokens,
             "output_tokens": v.outcome.output_tokens, "error": v.outcome.error} for i, v in sorted(run.sent.items())]
    return {"model": run.model, "config": config, "interrupted": run.interrupted, **s.to_json(), "requests": sent}


def run(args) -> int:
    run_, s = measure(args)
    if run_.interrupted:
        print(f"interrupted: {s.completed} of {args.num_prompts} requests completed", file=sys.stderr)
    print(table(s))
    if args.save_result:
        save_json(args.save_result, result_json(args, run_, s))
    return 130 if run_.interrupted else (1 if s.failed else 0)
