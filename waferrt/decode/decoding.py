"""What the decode's closed forms are given, and the pieces every one of them builds on.

Contract: pure values and closed forms from waferrt.core.cost's primitives, imported by the closed forms of a
layer (waferrt.decode.cost) and of an MoE layer's routed work (waferrt.decode.routed_cost) alike, so neither
imports the other's base. :class:`Decoding` is one frozen value, checked when made: the model, the dtype its
weights and K/V are stored in -- the cores compute at that dtype's rate (``core.cost.flop_cycles``), as the
tiles' ledger does (``Ledger(spec, dtype)``) -- the collectives (``fabric.comm.Collectives``: algorithm and
K), the head groups (decode.cost's module doc), the expert mapping of an MoE layer
(decode.moe_layout.MAPPINGS), the attention mode (dense or STAR's sparse:K) and the routing the MoE closed
forms price (:class:`Routing`). ``ELEMENTWISE_FLOPS`` is the one table of element-wise flops per element
(the tiles record element-wise work at it: decode.net, decode.prefill, training's forward);
``block_ffn_parts`` is a SwiGLU on a block of cores, the one formula of a dense FFN and of an expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from waferrt.core.arith import cdiv
from waferrt.core.cost import Cost, allreduce_cost, compute_cost, on_lines
from waferrt.core.dtypes import check_dtype
from waferrt.core.spec import HardwareSpec
from waferrt.fabric.comm import KTREE_FAST, Collectives
from waferrt.model.config import LlamaConfig
from waferrt.model.sparse import DENSE, AttentionMode

from .moe_layout import MAPPINGS

# flops per element of the element-wise work, as the tiles book it (exp counted as one flop):
# RMSNorm x*x, sum, *scale, *w; RoPE 4 mul + 2 add per pair; softmax *scale, max, -max, exp, sum, /sum;
# SiLU(g)*u as -g, exp, +1, /, *u; a residual add.
ELEMENTWISE_FLOPS = {"rmsnorm": 4, "rope": 3, "softmax": 6, "silu_mul": 5, "residual": 1}


class Routing(Enum):
    """Which experts the closed forms' MoE tokens pick (decode.routed_cost prices them)."""

    FIRST = "first"  # experts 0..top_k-1: a zero router's, as the emulator's ties run
    EXPECTED = "expected"  # the mean over uniformly routed micro-batches (seeded, ROUTING_SAMPLE tokens)


@dataclass(frozen=True)
class Decoding:
    """What a decode's closed forms need besides the region and the tokens: the model, the storage dtype
    (the cores compute at its rate), how the collectives run, the head groups (see the module doc)."""

    config: LlamaConfig
    dtype: str = "float32"
    coll: Collectives = KTREE_FAST
    head_groups: int = 1
    experts: str = "er"  # where an MoE layer's experts sit in its region (moe_layout.MAPPINGS)
    attention: AttentionMode = DENSE  # dense, or STAR's sparse:K (waferrt.model.sparse)
    routing: Routing = Routing.FIRST  # the MoE tokens' experts the closed forms price

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if not isinstance(self.routing, Routing):
            raise TypeError(f"Decoding.routing is a decode.decoding.Routing (FIRST or EXPECTED), got {self.routing!r}")
        if not isinstance(self.attention, AttentionMode):
            raise TypeError(f"Decoding.attention is a model.sparse.AttentionMode, got {self.attention!r}")
        if self.experts not in MAPPINGS:
            raise ValueError(f"Decoding.experts (the expert mapping) is one of {', '.join(MAPPINGS)}, "
                             f"got {self.experts!r}")
        if not isinstance(self.coll, Collectives):
            raise TypeError(f"Decoding.coll is a fabric.comm.Collectives, got {self.coll!r}")
        if self.head_groups < 1:
            raise ValueError(f"Decoding.head_groups must be >= 1, got {self.head_groups}")

    def flops(self, spec: HardwareSpec, n: int) -> Cost:
        """`n` flops on the busiest core, at the storage dtype's rate."""
        return compute_cost(spec, n, self.dtype)

    def line_reduce(self, spec: HardwareSpec, axis: str, n: int, nbytes: int, lines: int) -> Cost:
        """An allreduce of nbytes per core along `lines` parallel lines of n cores along `axis` at once (a
        torus's wrap only on a line as long as the wafer's: HardwareSpec.on_line, as the tiles' lines route)."""
        return on_lines(allreduce_cost(spec.on_line(axis, n), self.coll.algo, n, nbytes, self.coll.k), lines)


def block_ffn_parts(spec: HardwareSpec, dec: Decoding, cols: int, rows: int, hidden: int, b: int) -> list:
    """A SwiGLU FFN of `hidden` units on a cols x rows block of cores for b tokens: the one formula of a
    dense FFN and of an expert in its block."""
    dim_c, hid_r = cdiv(dec.config.dim, cols), cdiv(hidden, rows)
    return [
        ("ffn_in", "gemv", dec.flops(spec, 2 * b * dim_c * 2 * hid_r)),
        ("ffn_in.reduce", "allreduce", dec.line_reduce(spec, "x", cols, 4 * b * 2 * hid_r, rows)),
        ("silu_mul", "elementwise", dec.flops(spec, ELEMENTWISE_FLOPS["silu_mul"] * b * hid_r)),
        ("down", "gemv", dec.flops(spec, 2 * b * hid_r * dim_c)),
        ("down.reduce", "allreduce", dec.line_reduce(spec, "y", rows, 4 * b * dim_c, cols)),
    ]
