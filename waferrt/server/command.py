"""``waferrt serve``: the wafer behind an OpenAI-compatible HTTP server (waferrt.server.app) until Ctrl-C.

Contract: ``add_parser(subparsers)`` registers the subcommand (generate's placement flags, the same list:
waferrt.cli.generate.add_wafer_args; and --host, --port, --api-key, --max-queued, --chaos SEED[:N],
--policy, --http-faults); ``run(args) -> int`` checks them before anything loads (an address other than loopback
needs --api-key; --http-faults needs --api-key), loads and plans the model as generate does, starts the
tiles, loads the weights, arms the --chaos campaign (waferrt.cli.chaos.draw_plan: N faults, 4 by default,
of the kinds a single machine has, at steps up to CHAOS_STEPS; under --policy fail-fast the first
ends the serving: open streams end in an error chunk, then 503), starts the Runner and serves with uvicorn
on a socket bound here (the line ``waferrt serve: listening on http://HOST:PORT`` on stderr once it is:
``--port 0`` picks a free port). When uvicorn stops (Ctrl-C, SIGTERM) the runner ends and the tiles close.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket

from waferrt.cli.common import UsageError, checked_mesh, say, whole_number
from waferrt.cli.generate import add_wafer_args, wafer_llm
from waferrt.cli.model import open_model, ready_weights
from waferrt.faults.model import KINDS, FaultKind

HELP = "serve the model on the wafer over an OpenAI-compatible HTTP API"
DESCRIPTION = """\
Serve a Llama model decoded on the emulated wafer over HTTP, shaped as vLLM's OpenAI-compatible server:
/v1/models, /v1/completions, /v1/chat/completions (streamed as Server-Sent Events or whole), /tokenize,
/detokenize, /health, /metrics (Prometheus), /version, and the wafer's live state (/v1/wafer/state,
/v1/wafer/events). Requests join the running decode as they come (continuous batching on the tiles);
every response carries its usage and its wall and modelled times."""
EPILOG = """\
examples:
  waferrt serve                                       SmolLM2 on the default mesh, http://127.0.0.1:8000
  waferrt serve --model tiny.gguf --spec tiny --mesh 16x16 --tile 8x8 --kv-tokens 160 --port 0
  waferrt serve --host 0.0.0.0 --api-key s3cret         other machines may connect, with the key
  waferrt serve --chaos 7:3                           three seeded faults strike while requests run

then, with the openai package:
  from openai import OpenAI
  client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
  client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=16)"""
CHAOS_KINDS = tuple(k for k in KINDS if k is not FaultKind.NODE)  # a single machine's: no node to lose
CHAOS_STEPS = 64  # a --chaos fault fires at a tile's step up to this


def chaos(text: str) -> tuple[int, int]:
    """--chaos SEED[:N]: (seed, faults)."""
    seed, _, n = text.partition(":")
    try:
        out = int(seed), int(n) if n else 4
    except ValueError:
        raise argparse.ArgumentTypeError(f"--chaos {text!r}: write SEED or SEED:N, e.g. --chaos 7:3") from None
    if out[0] < 0 or not 1 <= out[1] <= 100:
        raise argparse.ArgumentTypeError(f"--chaos {text!r}: write SEED:N with SEED >= 0 and N in 1..100, "
                                         "e.g. --chaos 7:3")
    return out


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_wafer_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=whole_number(0, "--port 8000", 65535), default=8000, help="port (8000; 0: any free)")
    p.add_argument("--api-key", default=os.environ.get("WAFERRT_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $WAFERRT_API_KEY, else none)")
    p.add_argument("--max-queued", type=whole_number(0, "--max-queued 16", 10_000), default=16, metavar="N",
                   help="requests waiting beyond the running ones at most (16); more are refused with 429")
    p.add_argument("--chaos", type=chaos, metavar="SEED[:N]",
                   help="inject N (4) seeded faults (core, link, corrupt, straggler, tile) while requests run")
    p.add_argument("--policy", choices=("tolerant", "fail-fast"), default="tolerant",
                   help="with --chaos: recover from each fault (tolerant, the default) or stop serving at the first "
                        "(fail-fast: open streams end with an error chunk, new requests get 503)")
    p.add_argument("--http-faults", action="store_true",
                   help="allow POST /v1/wafer/faults to arm a fault (needs --api-key)")
    p.set_defaults(_run=run)
    return p


def _check(args) -> None:
    if args.compare_dense:
        raise UsageError("--compare-dense is generate's (it decodes the prompts given); leave it out")
    if args.prefill and args.streaming:
        raise UsageError("weight streaming has no MeshGEMM prefill; leave out --prefill")
    if not args.api_key and not _loopback(args.host):
        raise UsageError(f"--host {args.host} lets other machines connect: give --api-key KEY too (or listen on "
                         "127.0.0.1)")
    if args.policy != "tolerant" and not args.chaos:
        raise UsageError("--policy is what --chaos's faults do to the server: give --chaos SEED[:N] too")
    if args.http_faults and not args.api_key:
        raise UsageError("--http-faults lets a client arm faults: give --api-key KEY too")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _bind(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((host, port))
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}; pick another --port (0: any free)") from None
    sock.set_inheritable(True)
    return sock


def run(args) -> int:
    from waferrt.cli import placing

    _check(args)
    mesh = checked_mesh(args, lambda size: size)  # default: one tile
    model, tok = open_model(args)
    placement = placing.placement(args, model.config, mesh, [])
    sock = _bind(args.host, args.port)
    llm = wafer_llm(args, placement)
    with llm.open(progress=say):
        llm.load(ready_weights(model), progress=say)
        _serve(args, llm, tok, sock)
    return 0


def _serve(args, llm, tok, sock) -> None:
    import contextlib
    import dataclasses

    import uvicorn

    from waferrt.cli.chaos import draw_plan

    from .app import Options, make_app
    from .generation import Served
    from .metrics import Metrics
    from .protocol import Limits
    from .runner import Runner

    plan = None
    if args.chaos:
        plan = dataclasses.replace(draw_plan(llm, args.chaos[0], args.chaos[1], CHAOS_KINDS, 1, CHAOS_STEPS),
                                   policy=args.policy)
        say(f"--chaos: {len(plan.faults)} faults armed (seed {plan.seed}): "
            + ", ".join(f"{f.kind} {f.where()}" for f in plan.faults))
    with llm.faults(plan) if plan else contextlib.nullcontext():
        runner = Runner(llm, args.max_queued).start()
        try:
            served = Served(runner, tok, Limits(_name(args.model), llm.setup.kv_tokens, tok.vocab_size),
                            Metrics(lambda: _gauges(runner), runner.fault_log))
            app = make_app(served, Options(args.api_key, args.http_faults))
            host, port = sock.getsockname()[:2]
            say(f"waferrt serve: listening on http://{host}:{port}")
            uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)).run(sockets=[sock])
        finally:
            runner.stop()


def _name(model: str) -> str:
    return os.path.splitext(os.path.basename(model))[0] if os.sep in model or model.endswith(".gguf") else model


def _gauges(runner) -> tuple[int, int, float]:
    running, waiting = runner.counts
    with runner.lock:
        held = sorted(runner.live.items())[:runner.slots]
        reserved = sum(len(lv.job.request.prompt_ids) + lv.job.request.max_new_tokens for _, lv in held)
    return running, waiting, reserved / (runner.slots * runner.llm.setup.kv_tokens)
