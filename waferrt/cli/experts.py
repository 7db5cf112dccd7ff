"""The mixture-of-experts flags of the commands that place a model (``waferrt generate``, ``waferrt chaos``).

Contract: ``add_experts_arg(parser)`` registers --experts (the mapping: er or naive; None when not given, the
placement then takes er) and --balance N (NI-Balancer every N micro-batches; 0: off). ``check_experts_flags(args,
config)``, once the model's config is read and before anything is placed or Ray starts, refuses (UsageError,
one line) --experts or --balance for a dense model, and the flags an MoE has no path for yet (--streaming,
--prefill: the decode's own refusal, waferrt.decode.setup.DecodeSetup, would come only after the placement).
"""

from __future__ import annotations

from .common import UsageError, whole_number


def add_experts_arg(p) -> None:
    """--experts and --balance, for the commands that place a model (generate, chaos)."""
    p.add_argument("--experts", choices=("er", "naive"), default=None,
                   help="where a mixture of experts' experts sit in each layer region: er (ER-Mapping, bands of "
                        "rows that hold full tokens; default) or naive (blocks)")
    p.add_argument("--balance", type=whole_number(0, "--balance 8"), default=0, metavar="N",
                   help="NI-Balancer: every N micro-batches each MoE layer swaps two experts if that evens its "
                        "blocks' loads, moving them in parts while decoding goes on (0: off, the default)")


def check_experts_flags(args, config) -> None:
    """--experts / --balance against the model, and what an MoE cannot take yet (module docstring)."""
    if not config.moe:
        given = [flag for flag, value in (("--experts", args.experts), ("--balance", args.balance)) if value]
        if given:
            raise UsageError(f"{' and '.join(given)} place{'' if len(given) > 1 else 's'} the experts of a mixture "
                             f"of experts, but --model {args.model} is dense: leave {' and '.join(given)} out, or "
                             "give an MoE (e.g. waferrt convert --moe 8,2)")
        return
    for flag in ("--streaming", "--prefill"):
        if getattr(args, flag[2:]):
            raise UsageError(f"{flag} is not for a mixture of experts yet (--model {args.model}: {config.n_experts} "
                             f"experts, top {config.top_k}): leave out {flag}")
