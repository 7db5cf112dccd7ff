"""The training options of ``waferrt estimate --train`` and ``waferrt sweep --train``.

Contract: ``add_train_args(parser)`` adds --train, --global-batch, --seq, --template and --topology (the
flags both commands share); ``train_job(args, command)`` reads them into a TrainJob and a WaferTemplate,
refusing (UsageError, one line) the training flags without --train and the inference-only flags with it;
``run_estimate(args) -> int`` prints ``waferrt.estimator.train.estimate_train`` (text or --json). Exit status:
0 some strategy fits, 1 none does, 2 an argument is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from waferrt.core.template import TEMPLATES, WaferTemplate, template_by_name
from waferrt.core.topology import TOPOLOGIES, Topology
from waferrt.core.train_cost import TrainShape
from waferrt.estimator import train_papers as papers
from waferrt.estimator.train import TrainJob, estimate_train
from waferrt.estimator.train_papers import paper_rows
from waferrt.model.zoo import model_by_name

from .common import UsageError, refuse_together, whole_number

INFERENCE_ONLY = ("--strategy", "--kv-tokens", "--requests", "--preset", "--mesh", "--streaming", "--prompt-tokens",
                  "--pair", "--attention")


def topology_list(text: str) -> tuple[Topology, ...]:
    """'mesh,torus' -> the topologies (argparse type of sweep --topology)."""
    words = tuple(w.strip() for w in text.split(","))
    for w in words:
        if w not in TOPOLOGIES:
            raise argparse.ArgumentTypeError(f"{w!r} is not a topology; give a comma-separated list of "
                                             f"{', '.join(TOPOLOGIES)}, e.g. --topology mesh,torus")
    return tuple(Topology(w) for w in words)


def add_train_args(p, many: bool = False) -> None:
    """The training flags; `many`: --topology takes a comma-separated list (the sweep)."""
    p.add_argument("--train", action="store_true",
                   help="a training step instead of decode: weight streaming, a resident pipeline and tensor-stream "
                        "partition, each with its breakdown; --objective latency/throughput: the shortest step, "
                        "memory: the least SRAM per core")
    p.add_argument("--global-batch", type=whole_number(1, "--global-batch 256"), metavar="B",
                   help="sequences per optimizer step (with --train; default 256)")
    p.add_argument("--seq", type=whole_number(1, "--seq 2048"), metavar="S",
                   help="tokens per sequence (with --train; default 2048, at most the model's context)")
    p.add_argument("--template", choices=list(TEMPLATES), metavar="NAME",
                   help=f"the wafer as dies (with --train): {', '.join(TEMPLATES)} (default wse2, one die)")
    if many:
        p.add_argument("--topology", type=topology_list, metavar="LIST",
                       help=f"networks on each die, comma-separated (with --train; default {','.join(TOPOLOGIES)})")
    else:
        p.add_argument("--topology", choices=TOPOLOGIES, help="the network on each die (with --train; default mesh; a "
                       "torus wraps the rows and columns of dies too)")


def train_job(args, command: str, options: tuple[str, ...] = ()) -> tuple[TrainJob, WaferTemplate]:
    """The TrainJob and template of --train's arguments; UsageError for a training flag without --train, or
    an inference flag (`options` of the command that exist) with it."""
    if not args.train:
        for flag in ("--global-batch", "--seq", "--template", "--topology"):
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise UsageError(f"{flag} is an option of `waferrt {command} --train`: add --train, or leave it out")
        return None, None
    for other in INFERENCE_ONLY + options:
        if hasattr(args, other[2:].replace("-", "_")):
            refuse_together(args, "--train", (other,), "it is an option of decode; a training step takes "
                            "--global-batch, --seq, --template and --topology (the wafer: --template)")
    config, label = model_by_name(args.model)
    if config.moe:
        raise UsageError(f"--train: a training step of a mixture of experts is not modelled yet ({label}: "
                         f"{config.n_experts} experts, top {config.top_k}); give a dense model, e.g. --model llama3-8b")
    seq = args.seq or min(2048, config.max_seq_len)
    job = TrainJob(config, TrainShape(args.global_batch or 256, seq), args.dtype, label)
    one = Topology(args.topology) if isinstance(args.topology, str) else Topology()
    return job, template_by_name(args.template or "wse2", one)


def train_objective(args) -> str:
    """--objective for a training step: memory, or the shortest step (latency and throughput agree when the
    global batch is fixed); UsageError for memory without --train."""
    if args.objective == "memory" and not args.train:
        raise UsageError("--objective memory is for --train (the least SRAM per core); decode takes latency or "
                         "throughput")
    return "memory" if args.objective == "memory" else "throughput"


def run_estimate(args) -> int:
    try:
        job, template = train_job(args, "estimate")
        est = estimate_train(job, template, train_objective(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        doc = est.to_json()
        doc["papers"] = [dataclasses.asdict(r) for r in paper_rows(job)]
        print(json.dumps(doc, indent=1))
    else:
        print("\n".join([est.text(), *papers.lines(job, template)]))
    return 0 if est.chosen else 1
