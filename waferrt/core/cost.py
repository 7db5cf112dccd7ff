"""The cost model: what a piece of work would cost on the modelled wafer, in hops, stages and cycles.

Contract: :class:`Cost` is an immutable record of one piece of work on the critical path:
``hops`` (link traversals a message makes, summed along the critical path), ``stages`` (routing
stages on the critical path: a core that receives, combines and re-sends), ``link_bytes`` (bytes over
all links, summed), ``messages``, ``flops`` (of the busiest core) and ``cycles`` (modelled time).
``a + b`` is "a then b". The closed forms below are what the emulated primitives must count (the tests
check that they do); waferrt.decode.cost builds a decode step's cost from them, which the scheduler uses to predict a
decode step without running it. :class:`CostReport` is what a Wafer's runs so far would cost, by
primitive and by step.

Timing (PLMR): a message of b bytes that passes h hops and s routing stages takes
``h*alpha + s*(beta + b/link_bytes_per_cycle)`` cycles (wormhole routing: only the stages pay the
serialisation); ``f`` flops on one core take ``f/flops_per_cycle``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

from .arith import cdiv
from .dtypes import itemsize
from .spec import HardwareSpec

ALLREDUCE_ALGOS = ("ktree", "ring", "pipeline")


@dataclass(frozen=True)
class Cost:
    hops: int = 0
    stages: int = 0
    link_bytes: int = 0
    messages: int = 0
    flops: int = 0
    cycles: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def scaled(self, k: int) -> Cost:
        """k repetitions in sequence."""
        return Cost(*(getattr(self, f.name) * k for f in fields(self)))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def seconds(self, spec: HardwareSpec) -> float:
        return self.cycles / spec.clock_hz


def total(costs) -> Cost:
    """Several costs one after the other."""
    out = Cost()
    for c in costs:
        out = out + c
    return out


def message_cycles(spec: HardwareSpec, hops: int, stages: int, nbytes: float) -> float:
    return hops * spec.alpha_cycles + stages * (spec.beta_cycles + nbytes / spec.link_bytes_per_cycle)


def flop_cycles(spec: HardwareSpec, flops: float, dtype: str = "float32") -> float:
    """Cycles one core takes for `flops` on `dtype` data: the one owner of flops-to-cycles."""
    return flops / spec.flops_per_cycle_at(dtype)


def compute_cost(spec: HardwareSpec, flops: int, dtype: str = "float32") -> Cost:
    return Cost(flops=int(flops), cycles=flop_cycles(spec, flops, dtype))


@lru_cache(maxsize=256)
def ktree_groups(n: int, k: int) -> int:
    """Group size g of a K-level tree over n cores: the smallest g with g**k >= n."""
    if n < 1 or k < 1:
        raise ValueError(f"a K-tree needs n >= 1 cores and K >= 1 levels, got n={n}, K={k}")
    g = max(2, math.ceil(n ** (1.0 / k)))
    while g ** k < n:
        g += 1
    while g > 2 and (g - 1) ** k >= n:
        g -= 1
    return g


@lru_cache(maxsize=256)
def ktree_levels(n: int, k: int) -> tuple[tuple[int, int], ...]:
    """(stride, chain length) of each level of the reduce phase: at level l the members are the cores
    at multiples of stride = g**l, in groups of g; each group's chain has up to g-1 steps of stride hops."""
    g = ktree_groups(n, k)
    levels, stride = [], 1
    while stride < n:
        members = cdiv(n, stride)
        levels.append((stride, min(g, members) - 1))
        stride *= g
    return tuple(levels)


def allreduce_cost(spec: HardwareSpec, algo: str, n: int, nbytes: int, k: int = 2) -> Cost:
    """Allreduce of nbytes per core along a line of n cores.

    ktree:    K reduce levels, chains toward each group's first core (stride hops per step), then the
              root multicasts the sum back down the line (one stage, n-1 hops): ~K*n^(1/K) stages.
    ring:     reduce-scatter + allgather on the folded ring (logical neighbours at most 2 hops apart):
              2(n-1) steps of nbytes/n, ~4n hops.
    pipeline: the vector cut in n segments streams down a chain to core 0 (2(n-1) one-hop stages of
              nbytes/n), then a multicast back (one stage, n-1 hops).
    """
    if n == 1:
        return Cost()
    if algo == "ktree":
        g = ktree_groups(n, k)
        hops = stages = link = senders = 0
        for stride, chain in ktree_levels(n, k):
            members = cdiv(n, stride)
            sent = members - cdiv(members, g)
            hops, stages, senders = hops + chain * stride, stages + chain, senders + sent
            link += sent * stride * nbytes
        cyc = message_cycles(spec, hops, stages, nbytes) + message_cycles(spec, n - 1, 1, nbytes)
        return Cost(hops=hops + n - 1, stages=stages + 1, link_bytes=link + (n - 1) * nbytes,
                    messages=senders + n - 1, cycles=cyc)
    seg = 4 * cdiv(nbytes, 4 * n)  # the vector is cut in n equal (padded) float32 segments
    steps = 2 * (n - 1)
    if algo == "ring":
        hop_len = 2 if n > 2 else 1
        return Cost(hops=steps * hop_len, stages=steps, link_bytes=steps * (2 * n - 2) * seg,
                    messages=steps * n, cycles=steps * message_cycles(spec, hop_len, 1, seg))
    if algo == "pipeline":
        cyc = message_cycles(spec, steps, steps, seg) + message_cycles(spec, n - 1, 1, nbytes)
        return Cost(hops=steps + n - 1, stages=steps + 1, link_bytes=n * (n - 1) * seg + (n - 1) * nbytes,
                    messages=n * (n - 1) + n - 1, cycles=cyc)
    raise ValueError(f"unknown allreduce algorithm {algo!r}; choose one of {ALLREDUCE_ALGOS}")


def broadcast_cost(spec: HardwareSpec, n: int, nbytes: int) -> Cost:
    """One core multicasts nbytes to the n-1 others of its line (router multicast: one stage)."""
    if n == 1:
        return Cost()
    return Cost(hops=n - 1, stages=1, link_bytes=(n - 1) * nbytes, messages=n - 1,
                cycles=message_cycles(spec, n - 1, 1, nbytes))


def shift_cost(spec: HardwareSpec, n: int, nbytes: int, wrap: bool) -> Cost:
    """Every core of a line of n sends nbytes to its next core (and, with wrap, the last to the first)."""
    if n == 1:
        return Cost()
    hops = n - 1 if wrap else 1
    msgs = n if wrap else n - 1
    link = (2 * (n - 1) if wrap else n - 1) * nbytes
    return Cost(hops=hops, stages=1, link_bytes=link, messages=msgs,
                cycles=message_cycles(spec, hops, 1, nbytes))


def gemv_cost(spec: HardwareSpec, block: tuple[int, int], n_reduce: int, algo: str = "ktree", k: int = 2,
              dtype: str = "float32") -> Cost:
    """MeshGEMV: a local (out_block x in_block) = `block` GEMV on every core, its flops at `dtype`'s rate,
    then an allreduce of the out_block partial sums (`dtype` values) along the n_reduce cores that share
    the output block. (k = 1 is the plain chain: reduce step by step to the line's end, multicast back.)"""
    out_block, in_block = block
    return (compute_cost(spec, 2 * out_block * in_block, dtype)
            + allreduce_cost(spec, algo, n_reduce, itemsize(dtype) * out_block, k))


@dataclass(frozen=True)
class CostReport:
    """What the runs so far would cost on the modelled wafer."""

    spec: HardwareSpec
    by_op: dict  # primitive -> Cost, over every step
    per_step: tuple  # one {primitive: Cost} per step (wafer.run), in order

    @property
    def steps(self) -> int:
        return len(self.per_step)

    @property
    def total(self) -> Cost:
        return total(self.by_op.values())

    def step_totals(self) -> list[Cost]:
        return [total(step.values()) for step in self.per_step]

    def __str__(self) -> str:
        lines = [f"{'primitive':<18}{'hops':>8}{'stages':>8}{'link bytes':>12}{'flops/core':>12}{'cycles':>12}"]
        for name, c in sorted(self.by_op.items()):
            lines.append(f"{name:<18}{c.hops:>8}{c.stages:>8}{c.link_bytes:>12}{c.flops:>12}{c.cycles:>12.0f}")
        t = self.total
        lines.append(f"{'total':<18}{t.hops:>8}{t.stages:>8}{t.link_bytes:>12}{t.flops:>12}{t.cycles:>12.0f}")
        steps = ", ".join(f"{c.seconds(self.spec) * 1e6:.2f}" for c in self.step_totals()[-8:])
        lines.append(f"{self.steps} step(s); modelled time {t.seconds(self.spec) * 1e6:.2f} us on {self.spec.name} "
                     f"at {self.spec.clock_hz / 1e9:.2f} GHz (last steps, us: {steps})")
        return "\n".join(lines)
