"""``waferrt convert``: write one of the project's own models as a llama GGUF that every command reads.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` writes the file and prints
what it holds. A cut (``--shape NAME --layers N [--vocab V] [--seed S] [--dtype D]``) is a named model shape
(``waferrt.model.zoo``) cut to N layers and V tokens, with seeded random weights (``waferrt.model.convert``):
the model math lives there, this module only reads and checks the command line (``_add_cut_arguments``,
``_cut``) and writes (``_write_cut``). The file is written next to OUT and renamed into place when whole, so
a failed or interrupted run never leaves half a GGUF under OUT's name. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import time

from waferrt.model.convert import VALUE_DTYPES
from waferrt.model.zoo import MODELS

from .common import UsageError, output_path, say, whole_number

EPILOG = """\
examples:
  waferrt convert --shape llama3-8b --layers 2 --vocab 32768 llama3-8b-2l.gguf
      Llama3-8B's real layers (dim 4096, 32/8 heads, hidden 14336), 2 of them, a 32768-token vocabulary,
      float16 values: 0.9 GB. Then: waferrt plan --model llama3-8b-2l.gguf --spec wse2 ...
  waferrt convert --shape smollm2-135m --layers 4 --vocab 1024 --seed 7 small.gguf
      a small model for quick runs

The weights are seeded random (N(0, 1/fan_in) matrices, 1 + N(0, 0.1) norms: activations stay O(1)), so the
tokens mean nothing; the shapes, the bytes and the arithmetic are the real model's. The output head is tied
to the embedding (the wafer decode places one embedding/head table). With --dtype float16 every tensor is F16:
a wafer storing float16 (generate --dtype float16) holds exactly what the numpy reference computes with."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert", help="write a named model shape, cut to a few layers, with seeded weights, as a GGUF",
        description="Write one of the project's own models as a llama GGUF file: a named model shape (its "
                    "real dimensions) cut to a few layers and a smaller vocabulary, with seeded random weights. "
                    "Every command that takes --model reads it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_cut_arguments(p)
    p.add_argument("out", type=output_path("model.gguf"), metavar="OUT.gguf", help="the GGUF file to write")
    p.set_defaults(_run=run)
    return p


def _shape_name(text: str) -> str:
    if text.lower() not in MODELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a named model shape; use one of "
                                         f"{', '.join(sorted(MODELS))}")
    return text.lower()


def _add_cut_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a cut of a named shape."""
    p.add_argument("--shape", type=_shape_name, metavar="NAME",
                   help=f"the named model shape to cut: {', '.join(sorted(MODELS))}")
    p.add_argument("--layers", type=whole_number(1, "--layers 2"), metavar="N",
                   help="how many of its layers to keep (1 .. the shape's own)")
    p.add_argument("--vocab", type=whole_number(256, "--vocab 32768"), default=0, metavar="V",
                   help="vocabulary size, 256 .. the shape's own (default: the shape's own)")
    p.add_argument("--seed", type=whole_number(0, "--seed 0"), default=0, help="seed of the weights (default 0)")
    p.add_argument("--dtype", choices=VALUE_DTYPES, default="float16",
                   help="the tensors' type (default float16: F16 tensors, half the file)")


def _cut(args):
    """The Cut the arguments ask for, or UsageError saying what is missing or out of range."""
    from waferrt.model.convert import Cut

    missing = [flag for flag, v in (("--shape", args.shape), ("--layers", args.layers)) if v is None]
    if missing:
        raise UsageError(f"give {' and '.join(missing)}, e.g. --shape llama3-8b --layers 2 --vocab 32768")
    try:
        return Cut(args.shape, args.layers, args.vocab, args.seed, args.dtype)
    except ValueError as e:
        raise UsageError(f"{e}") from None


def _write_cut(cut, out: str) -> None:
    from waferrt.model.convert import write_cut

    say(f"writing {cut.describe()}")
    t0, part = time.perf_counter(), f"{out}.part"
    try:
        write_cut(part, cut)
        os.replace(part, out)
    finally:
        if os.path.exists(part):
            os.remove(part)
    print(f"wrote {out}: {os.path.getsize(out) / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s; "
          f"{cut.describe()}")


def run(args) -> int:
    _write_cut(_cut(args), args.out)
    return 0
