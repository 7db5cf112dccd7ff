"""The parallelism strategy of ``waferrt plan`` and ``waferrt generate``: --strategy, --objective, and the pick.

Contract: ``add_strategy_args(parser)`` adds ``--strategy layer|tensor|grouped[:N]`` (checked by its
argparse type) and ``--objective latency|throughput``. ``placed(args, config, spec, kv, nodes,
mesh_for)`` returns ``(Placement, Choice or None)`` in ``args.dtype``: with neither flag, layer-pipelined
regions (one layer each) on ``mesh_for(strategy)`` (the --mesh given, or the default for that strategy), as
before strategies existed; with a
--strategy naming one strategy, that one; otherwise (``--objective``, or ``--strategy grouped``) every
candidate is planned and timed by ``waferrt.scheduler.strategies.choose``, which says why the winner won.
A model that does not fit raises ``PlanError`` (the caller prints it).
"""

from __future__ import annotations

import argparse
import re

from waferrt.model.sparse import DENSE
from waferrt.scheduler.strategies import STRATEGY_HELP, choose, parse_strategy
from waferrt.scheduler.types import OBJECTIVES, Objective


def strategy_text(text: str) -> str:
    """--strategy: layer, tensor, grouped or grouped:N (argparse type; N is checked against the model later)."""
    if not re.fullmatch(r"layer|tensor|grouped(:[1-9][0-9]*)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a strategy: write layer, tensor, grouped or grouped:N "
                                         "(N layers per region, e.g. grouped:4)")
    return text


def add_strategy_args(p) -> None:
    p.add_argument("--strategy", type=strategy_text, metavar="S", help=STRATEGY_HELP + "; default: layer, or the "
                   "best for --objective when that is given")
    p.add_argument("--objective", choices=OBJECTIVES,
                   help="let the planner pick the strategy: latency (one request's modelled time per token) or "
                        "throughput (modelled tokens/s with --requests in flight); it prints every candidate")


def placed(args, config, spec, kv, nodes, mesh_for):
    """(Placement, Choice or None) as the module docstring says."""
    from waferrt.scheduler import PlanOptions, plan

    dtype, attention = args.dtype, getattr(args, "attention", DENSE)  # generate's --attention: its lists' room
    tried = parse_strategy(args.strategy or "layer", config.n_layers)
    if args.objective is None and len(tried) == 1:
        s = tried[0]
        return plan(config, spec, mesh_for(s), kv=kv, options=PlanOptions(dtype=dtype, strategy=s, nodes=nodes,
                                                                          attention=attention)), None
    if args.strategy is None:
        tried = None  # every strategy
    choice = choose(config, spec, kv, Objective(args.objective or "latency", tried), mesh_for,
                    PlanOptions(dtype=dtype, nodes=nodes, attention=attention))
    return choice.placement, choice

