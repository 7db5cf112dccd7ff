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
serialisation); a K-tree's chains stream the partial sums word by word through their members (WaferLLM's
kernel), so each step pays ``hops*alpha + beta`` and a level's message is serialised once per stream its
roots read. ``f`` flops on one core take ``f/flops_per_cycle``. Routes follow ``spec.topology``
(core.topology: mesh, torus, mesh-switch; the mesh unless told), so a torus's wrap and a mesh-switch's switch
shorten what they shorten and the mesh's figures are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

from .arith import cdiv
from .dtypes import itemsize
from .spec import HardwareSpec
from .topology import alltoall_load

ALLREDUCE_ALGOS = ("ktree", "chain", "ring", "pipeline")


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
        return cycles_seconds(spec, self.cycles)


def mean(costs) -> Cost:
    """The mean of several costs, field by field (an expectation over samples: fields may be fractional)."""
    costs = list(costs)
    if len(costs) == 1:
        return costs[0]
    return Cost(*(sum(getattr(c, f.name) for c in costs) / len(costs) for f in fields(Cost)))


def cycles_seconds(spec: HardwareSpec, cycles: float) -> float:
    """Modelled cycles in seconds at the spec's clock: the one owner of the conversion (``Cost.seconds``)."""
    return cycles / spec.clock_hz


def total(costs) -> Cost:
    """Several costs one after the other."""
    out = Cost()
    for c in costs:
        out = out + c
    return out


def serialise_cycles(spec: HardwareSpec, nbytes: float) -> float:
    """Cycles a message of nbytes takes to pass one link (its serialisation)."""
    return nbytes / spec.link_bytes_per_cycle


def message_cycles(spec: HardwareSpec, hops: int, stages: int, nbytes: float) -> float:
    return hops * spec.alpha_cycles + stages * (spec.beta_cycles + serialise_cycles(spec, nbytes))


def on_lines(c: Cost, lines: int) -> Cost:
    """The same collective run on `lines` parallel lines at once: the critical path is one line's, the
    traffic (messages, link bytes) is every line's -- what the tiles book."""
    return Cost(hops=c.hops, stages=c.stages, link_bytes=c.link_bytes * lines, messages=c.messages * lines,
                flops=c.flops, cycles=c.cycles)


def segment_bytes(nbytes: int, n: int) -> int:
    """The bytes of one of the n equal float32 segments a ring or pipeline allreduce cuts nbytes into (the
    last padded to the others' size): the one owner of the padding."""
    return 4 * cdiv(nbytes, 4 * n)


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


@dataclass(frozen=True)
class KtreeLevel:
    """One reduce level of a K-tree: `steps` in order, each a tuple of (dist, sending positions) -- every
    sender hands its partial sum `dist` hops along the line (+: toward higher positions) to the next member
    of its chain, all at once; `halves` is 2 when some group's root takes partial sums from both sides (it
    reads the two streams one after the other), else 1."""

    steps: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
    halves: int


@dataclass(frozen=True)
class KtreePlan:
    """The reduce levels of a K-tree over a line, and the core that ends with the sum (it multicasts it)."""

    levels: tuple[KtreeLevel, ...]
    root: int


def _chain_steps(chain: list[int], steps: list[dict]) -> None:
    """A chain of positions ending at its group's root: member t hands its partial sum to member t+1 at step t."""
    for t in range(len(chain) - 1):
        while len(steps) <= t:
            steps.append({})
        steps[t].setdefault(chain[t + 1] - chain[t], []).append(chain[t])


@lru_cache(maxsize=256)
def ktree_plan(n: int, k: int, centred: bool = True) -> KtreePlan:
    """WaferLLM's K-tree allreduce (MeshInfra/WaferLLM MeshGEMV comm_pe.csl ``two_tree_allreduce``): the line's
    members in groups of g (``ktree_groups``), each group's root its member g//2 (the kernel's root_1st_phase =
    group size / 2); both halves of a group reduce toward the root at once, every member adding its own partial
    sum to the stream and passing it on word by word; the roots are the next level's members. centred=False
    roots each group at its first member instead (one chain from the far end: the Cerebras SDK's GEMV)."""
    g = ktree_groups(n, k)
    members, levels = list(range(n)), []
    while len(members) > 1:
        steps: list[dict] = []
        roots, halves = [], 1
        for i in range(0, len(members), g):
            grp = members[i:i + g]
            r = len(grp) // 2 if centred else 0
            roots.append(grp[r])
            _chain_steps(grp[:r + 1], steps)
            _chain_steps(grp[r:][::-1], steps)
            halves = 2 if 0 < r < len(grp) - 1 else halves
        levels.append(KtreeLevel(tuple(tuple((d, tuple(src)) for d, src in sorted(s.items())) for s in steps), halves))
        members = roots
    return KtreePlan(tuple(levels), members[0])


def tree_plan(algo: str, n: int, k: int) -> KtreePlan:
    """The reduce plan of a tree-shaped allreduce: "ktree" (K levels, centred roots) or "chain" (one chain to
    core 0)."""
    return ktree_plan(n, k, True) if algo == "ktree" else ktree_plan(n, 1, False)


def ktree_cost(spec: HardwareSpec, plan: KtreePlan, n: int, nbytes: int) -> Cost:
    """A K-tree's reduce levels then the root's multicast back down the line (one stage, both ways at once).
    A step costs its longest hand-over's hops and one routing stage (beta); a level's message is serialised
    once per stream its roots read (pipelined: every member forwards the partial sums word by word)."""
    topo = spec.topology
    hops = stages = link = msgs = streams = 0
    for level in plan.levels:
        for step in level.steps:
            hops, stages = hops + max(topo.step_hops(n, src, d) for d, src in step), stages + 1
            link += sum(len(src) * topo.step_hops(n, src, d) for d, src in step) * nbytes
            msgs += sum(len(src) for _, src in step)
        streams += level.halves
    far = topo.farthest(n, plan.root)
    cyc = (message_cycles(spec, hops, stages, 0) + streams * serialise_cycles(spec, nbytes)
           + message_cycles(spec, far, 1, nbytes))
    return Cost(hops=hops + far, stages=stages + 1, link_bytes=link + (n - 1) * nbytes, messages=msgs + n - 1,
                cycles=cyc)


def reduce_flops(algo: str, n: int, values: int, k: int = 2) -> int:
    """The flops of the busiest core's reductions in an allreduce of `values` values per core along a line of
    n cores: ktree -- a level's root combines the stream of each half that reaches it (``ktree_plan``);
    chain -- every core adds its own partial sum into the one stream once; ring -- n-1 combines of a 1/n
    chunk (reduce-scatter); pipeline -- every one of the n chunks combined once on the way down the chain."""
    if n <= 1:
        return 0
    if algo == "ktree":
        return sum(level.halves for level in ktree_plan(n, k).levels) * values
    if algo == "chain":
        return values
    chunk = cdiv(values, n)
    return (n - 1) * chunk if algo == "ring" else n * chunk


def allreduce_cost(spec: HardwareSpec, algo: str, n: int, nbytes: int, k: int = 2) -> Cost:
    """Allreduce of nbytes per core along a line of n cores.

    ktree:    WaferLLM's K-tree (``ktree_plan``): K reduce levels, both halves of every group reducing toward
              its middle at once, partial sums forwarded word by word (a step pays hops and beta, a level's
              message is serialised once per stream its roots read), then the root multicasts the sum both
              ways (one stage, ~n/2 hops): ~K*n^(1/K)/2 stages, ~n hops.
    chain:    the Cerebras SDK's GEMV reduction: one chain from the line's far end to core 0, forwarded word
              by word (n-1 stages, the message serialised once), then a multicast back (n-1 hops).
    ring:     reduce-scatter + allgather on the ring of ``Topology.ring_order`` (the folded ring of a mesh:
              logical neighbours at most 2 hops apart, ~4n hops; a torus's line: 1 hop each, 2(n-1) hops):
              2(n-1) steps of nbytes/n.
    pipeline: the vector cut in n segments streams down a chain to core 0 (2(n-1) one-hop stages of
              nbytes/n), then a multicast back (one stage, n-1 hops).
    """
    if n == 1:
        return Cost()
    if algo in ("ktree", "chain"):
        return ktree_cost(spec, tree_plan(algo, n, k), n, nbytes)
    seg = segment_bytes(nbytes, n)
    steps = 2 * (n - 1)
    if algo == "ring":
        hop_len, ring_len = spec.topology.ring_hops(n)
        return Cost(hops=steps * hop_len, stages=steps, link_bytes=steps * ring_len * seg,
                    messages=steps * n, cycles=steps * message_cycles(spec, hop_len, 1, seg))
    if algo == "pipeline":
        far = spec.topology.farthest(n, 0)
        cyc = message_cycles(spec, steps, steps, seg) + message_cycles(spec, far, 1, nbytes)
        return Cost(hops=steps + far, stages=steps + 1, link_bytes=n * (n - 1) * seg + (n - 1) * nbytes,
                    messages=n * (n - 1) + n - 1, cycles=cyc)
    raise ValueError(f"unknown allreduce algorithm {algo!r}; choose one of {ALLREDUCE_ALGOS}")


def broadcast_cost(spec: HardwareSpec, n: int, nbytes: int, root: int = 0) -> Cost:
    """The core at `root` multicasts nbytes to the n-1 others of its line (router multicast: one stage; the
    farthest core is max(root, n-1-root) hops away on a mesh, n//2 on a torus: ``Topology.farthest``)."""
    if n == 1:
        return Cost()
    hops = spec.topology.farthest(n, root)
    return Cost(hops=hops, stages=1, link_bytes=(n - 1) * nbytes, messages=n - 1,
                cycles=message_cycles(spec, hops, 1, nbytes))


@dataclass(frozen=True)
class Phase:
    """Messages that travel at once: the longest route's `hops`, the `messages` sent, the bytes over all links
    (`link_bytes`) and the `busiest` link's bytes. ``decode.linkload.LinkLoad`` is one, counted link by link."""

    hops: int
    messages: int
    link_bytes: int
    busiest: float


def alltoall_cost(spec: HardwareSpec, phase: Phase) -> Cost:
    """A phase whose messages all travel at once (one routing stage): the longest route's hops, then the
    busiest link's bytes one after the other. The one owner of an all-to-all's cost: the MoE's dispatch and
    combine, a relayout, the balancer's moves (a ``LinkLoad``) and a line's all-to-all (``line_alltoall_cost``)."""
    if not phase.messages:
        return Cost()
    return Cost(hops=phase.hops, stages=1, link_bytes=phase.link_bytes, messages=phase.messages,
                cycles=message_cycles(spec, phase.hops, 1, phase.busiest))


def line_alltoall_cost(spec: HardwareSpec, n: int, nbytes: int) -> Cost:
    """All-to-all along a line of n cores: every core holds nbytes, cut in n chunks, and sends chunk j to core
    j, all at once over ``spec.topology``'s routes (one stage): the longest route's hops, then the busiest
    link's bytes serialised (``core.topology.alltoall_load``); link bytes are every chunk times its hops."""
    chunk = cdiv(nbytes, n)
    load = alltoall_load(spec.topology, n)
    return alltoall_cost(spec, Phase(load.diameter, n * (n - 1), load.total * chunk, load.busiest * chunk))


def shift_cost(spec: HardwareSpec, n: int, nbytes: int, wrap: bool) -> Cost:
    """Every core of a line of n sends nbytes to its next core (and, with wrap, the last to the first: n-1 hops
    back along a mesh line, one over a torus's wrap link)."""
    if n == 1:
        return Cost()
    back = spec.topology.line_hops(n, n - 1, 0) if wrap else 0
    hops = max(back, 1)
    msgs = n if wrap else n - 1
    link = (n - 1 + back) * nbytes
    return Cost(hops=hops, stages=1, link_bytes=link, messages=msgs,
                cycles=message_cycles(spec, hops, 1, nbytes))


@dataclass(frozen=True)
class GemvBlock:
    """A core's block of a GEMV's matrix: `rows` outputs (the partial sums its line reduces) by `cols` inputs."""

    rows: int
    cols: int


def gemv_cost(spec: HardwareSpec, block: GemvBlock | tuple[int, int], n_reduce: int, algo: str = "ktree", k: int = 2,
              dtype: str = "float32") -> Cost:
    """MeshGEMV: a local (rows x cols) `block` GEMV on every core, its flops at `dtype`'s rate, then an
    allreduce of the `rows` partial sums (`dtype` values) along the n_reduce cores that share the output
    block. (k = 1 is the plain chain: reduce step by step to the line's end, multicast back.) A plain
    ``(rows, cols)`` tuple, as docs/tutorial.md writes it, is taken as that GemvBlock."""
    block = block if isinstance(block, GemvBlock) else GemvBlock(*block)
    return (compute_cost(spec, 2 * block.rows * block.cols, dtype)
            + allreduce_cost(spec, algo, n_reduce, itemsize(dtype) * block.rows, k))


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
