"""An MoE layer on the mesh: expert parallelism in its region, dispatch and combine hop by hop, per link.

Contract: :class:`MoELayerShard` is a LayerShard (the attention as a dense layer's) whose FFN is the
mixture of experts of waferrt.model.reference.ffn, with the experts on the blocks a mapping gives
(waferrt.decode.moe_layout: "er" or "naive"). For a micro-batch of normed hidden states h (B, C, dim_c):

1. router: a MeshGEMV of the router (dim over the columns, a copy on every row), so every core ends with
   every logit; the reference's ``top_k_gates`` picks each token's experts and gates.
2. dispatch: each token goes to the block of each chosen expert (once per block). Every row of the region
   holds a full copy of the token (split over the columns), so each block row takes it from its own row:
   the pieces of the region's column split move along the row to the block's column split, one hop at a time.
3. the experts: each a MeshGEMV SwiGLU in its block (blocks run side by side: the ledger books the
   busiest block, waferrt.core.ledger.merge_parallel).
4. combine: each expert's gated output goes back from its block's column split to the region's (along the
   rows, reversed dispatch), then up and down every column, summed on the way, until every row holds the
   sum again (a link carries one partial sum when some contribution lies behind it).

Every message is routed one hop at a time and booked per directed link in a LinkLoad
(waferrt.decode.linkload); the ledger books each phase as one Cost (``alltoall_cost``). ``traffic`` keeps
the dispatch's and the combine's LinkLoads summed over the micro-batches, ``booked`` the ledger's Cost of each
summed, ``links`` (a PhaseLinks) every link's bytes of the attention phase and of the MoE phase as every
collective of the layer books them (the LineComms' taps), ``routed`` how many tokens each expert received
(the routing histogram). ``migrate`` moves two experts' blocks (NI-Balancer, waferrt.decode.balancer): at
once (a stall), or a part per micro-batch while decoding goes on, each link's bytes of a part during the
phase of that micro-batch whose recorded links leave it cold; with ``balance`` (DecodeSetup.balance) the
shard looks every ``balance`` runs at the histogram of those runs (``seen``) and starts the swap
``plan_swap`` finds (``swaps``: those done). ``step`` (an :class:`MoEStep`) is the last run's router, routed
work and migration as booked: the decode's modelled schedule takes each token's share of it
(waferrt.decode.program). ``route_zipf`` routes by a seeded Zipf instead of the router (a skewed workload
for measuring costs: benchmarks/moe.py); :func:`run_steps` runs decode steps through a shard.
:func:`pack_moe_layer` cuts an MoE layer's weights for its region and mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.core.cost import Cost, alltoall_cost, flop_cycles
from waferrt.core.dtypes import to_storage
from waferrt.core.ledger import Ledger, merge_parallel
from waferrt.core.mesh import Region
from waferrt.core.spec import HardwareSpec
from waferrt.fabric.comm import LineComm, Span
from waferrt.model.config import LlamaConfig
from waferrt.model.reference import top_k_gates
from waferrt.model.sparse import softmax

from .balancer import Swap, at_once_cost, plan_swap, step_cost, swap_load
from .linkload import AllToAll, LinkLoad, PhaseLinks
from .moe_layout import expert_blocks, expert_layouts, router_layout
from .pack import Chunks, pack_ffn, pack_layer, pack_matrix
from .shards import Items, LayerShard, mlp


def pack_moe_layer(config: LlamaConfig, lw, region: Region, mapping: str, dtype: str = "float32") -> dict:
    """An MoE layer's arrays: the attention's (pack_layer, with the shared expert if any), "router", every
    expert e's "w13.e" / "w2.e" cut over its block, and "blocks" (n_experts, 4) int: x0, y0, w, h."""
    out = pack_layer(config, lw, region, dtype)
    out["router"] = to_storage(pack_matrix(lw.router, router_layout(config, region)), dtype)
    blocks = expert_blocks(config.n_experts, region, mapping)
    for e, block in enumerate(blocks):
        gate, up, down = ((lambda m=m: m) for m in (lw.w_gate_exps[e], lw.w_up_exps[e], lw.w_down_exps[e]))
        packed = pack_ffn(gate, up, down, expert_layouts(config, block))
        out.update({f"{k}.{e}": to_storage(v, dtype) for k, v in packed.items()})
    out["blocks"] = np.array([(b.x0, b.y0, b.w, b.h) for b in blocks], np.int64)
    return out


BALANCE_STEPS = 4  # the parts NI-Balancer cuts a swap into, one per micro-batch


@dataclass(frozen=True)
class MoEStep:
    """An MoE layer's run on one micro-batch of `tokens` tokens, as the ledger booked it: the router; the
    routed work -- the experts (blocks side by side: the busiest block's), the dispatch and the combine
    (their links as routed: ``alltoall``) and NI-Balancer's migration (the part of a swap booked in this run,
    plus the stall of a swap moved at once since the last run). The modelled schedule takes each token's
    share of the routed work (waferrt.decode.program) in place of the closed forms' typical token."""

    tokens: int
    router: Cost
    experts: Cost
    alltoall: tuple[Cost, Cost]  # (dispatch, combine)
    migration: Cost

    @property
    def routed(self) -> Cost:
        return self.experts + self.alltoall[0] + self.alltoall[1] + self.migration

    @property
    def phase(self) -> Cost:
        """The MoE phase (a shared expert aside)."""
        return self.router + self.routed

    def share_cycles(self) -> float:
        """Each token's share of the routed work's cycles."""
        return self.routed.cycles / self.tokens

    def compute_cycles(self, spec: HardwareSpec, dtype: str) -> dict[str, float]:
        """The MoE phase's compute: the router's and the busiest block's flops at the cores' rate (the rest of
        each piece's critical path is its communication: reductions, routing, migration)."""
        return {"router": flop_cycles(spec, self.router.flops, dtype),
                "experts": flop_cycles(spec, self.experts.flops, dtype)}

    def comm_cycles(self, spec: HardwareSpec, dtype: str) -> dict[str, float]:
        """The MoE phase's communication by piece: the router's row reduction, the experts' reductions in
        their blocks (the busiest block's critical path less its compute), the all-to-all, the migration."""
        compute = self.compute_cycles(spec, dtype)
        return {"router": self.router.cycles - compute["router"], "experts": self.experts.cycles - compute["experts"],
                "alltoall": self.alltoall[0].cycles + self.alltoall[1].cycles, "migration": self.migration.cycles}


class MoELayerShard(LayerShard):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config, region = self.config, self.region
        self.blocks = tuple(Region(*b) for b in self.arrays["blocks"].tolist())
        self.dims = Chunks(config.dim, region.w)
        self.block_dims = {b: Chunks(config.dim, b.w) for b in set(self.blocks)}
        self.routes = AllToAll(config.dim, region, self.blocks)
        self.traffic = {"dispatch": LinkLoad(region), "combine": LinkLoad(region)}
        self.booked = {"dispatch": Cost(), "combine": Cost()}  # what the ledger booked for each phase, summed
        self.routed = np.zeros(config.n_experts, np.int64)
        self.links, self.mark = PhaseLinks(region), None  # every link's bytes per phase; where this run began
        for comm in (self.cx, self.cy):
            comm.listen(self.links)
        self.migration: list | None = None  # [swap, its LinkLoad, steps, steps done]
        self.balance, self.runs, self.swaps = 0, 0, []  # NI-Balancer: look every `balance` runs; the swaps done
        self.seen = np.zeros(config.n_experts, np.int64)  # the histogram since NI-Balancer's last look
        self.step: MoEStep | None = None  # the last run's routed work, as booked
        self.stall = Cost()  # a swap moved at once since the last run
        self.zipf: tuple[np.ndarray, np.random.Generator] | None = None  # a Zipf workload's routing (route_zipf)

    def run(self, x: np.ndarray, items: Items) -> np.ndarray:
        self.mark = self.links.mark()
        return super().run(x, items)

    def _ffn(self, h: np.ndarray) -> np.ndarray:
        """The MoE FFN of h (B, C, dim_c) -> (B, C, dim_c), plus the shared expert's output if any (the MoE
        phase of ``links``; the rest of the layer is the attention phase)."""
        self.links.phase = "moe"
        try:
            out = self._experts(h)
            return out + super()._ffn(h) if self.config.shared_hidden_dim else out
        finally:
            self.links.phase = "attention"

    def _experts(self, h: np.ndarray) -> np.ndarray:
        config = self.config
        router = Ledger(self.ledger.spec, self.ledger.dtype)  # booked apart: MoEStep keeps it
        with router.op("router"):
            logits = self.net.gemv(self._comm("x", self.region, router), self._w("router"), h)  # (B, R, E)
        self.ledger.add(router.total())
        experts, gates = self.route(logits[:, 0])  # (B, k) each
        full = self.dims.join(h)  # (B, dim)
        out, ledgers = np.zeros_like(full), {}
        for e in range(config.n_experts):
            rows, slot = np.nonzero(experts == e)  # the tokens that chose expert e, and in which slot
            if rows.size:
                led = ledgers.setdefault(self.blocks[e], Ledger(self.ledger.spec, self.ledger.dtype))
                with led.op("expert"):
                    y = self._expert(e, full[rows], led)  # (n, dim)
                out[rows] += gates[rows, slot, None] * y
        busiest = merge_parallel([led.total() for led in ledgers.values()])  # blocks side by side
        self.ledger.add(busiest)
        hist = np.bincount(experts.ravel(), minlength=config.n_experts)
        self.routed += hist
        self.seen += hist
        dispatch, combine = self._alltoall(experts)
        self.step = MoEStep(len(full), router.total(), busiest, (dispatch, combine), self._balance())
        return self.dims.split(out)

    def route(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each token's experts and gates from its router logits (B, E): the reference's top_k_gates, or with
        a Zipf workload (``zipf``) k distinct experts drawn by it, gated by a softmax of their logits."""
        if self.zipf is None:
            return top_k_gates(logits, self.config.top_k)
        p, rng = self.zipf
        experts = np.stack([rng.choice(len(p), self.config.top_k, replace=False, p=p) for _ in logits])
        return experts, softmax(np.take_along_axis(logits, experts, axis=-1))

    def route_zipf(self, s: float, seed: int, clustered: bool = False) -> None:
        """Route every token from now on by a seeded Zipf over the experts (rank r drawn with weight r**-s; the
        ranks a seeded shuffle of the experts, or with `clustered` in expert order, the hottest side by side):
        the skewed routing of a trained router's hot experts, as a workload for measuring costs -- the tokens
        are no longer the reference's."""
        rng = np.random.default_rng(seed)
        weight = np.arange(1, self.config.n_experts + 1, dtype=float) ** -s
        p = weight if clustered else weight[rng.permutation(self.config.n_experts)]
        self.zipf = (p / p.sum(), rng)

    def _comm(self, axis: str, block: Region, led: Ledger) -> LineComm:
        """A line communicator over `block` booking in `led`, its links recorded in ``links``."""
        comm = LineComm(axis, Span.of(block), led, fast=self.coll.fast)
        comm.listen(self.links)
        return comm

    def _expert(self, e: int, x: np.ndarray, led: Ledger) -> np.ndarray:
        """Expert e's SwiGLU of x (n, dim) -> (n, dim), as MeshGEMVs in its block (booked in `led`)."""
        block = self.blocks[e]
        dims = self.block_dims[block]
        cx, cy = self._comm("x", block, led), self._comm("y", block, led)
        return dims.join(mlp(self.net, cx, cy, self._w(f"w13.{e}"), self._w(f"w2.{e}"), dims.split(x)))

    def _alltoall(self, experts: np.ndarray) -> tuple[Cost, Cost]:
        """Book the dispatch and the combine of the micro-batch's tokens to their experts' blocks."""
        costs = []
        for name, load in zip(("dispatch", "combine"), self.routes.loads(experts), strict=True):
            costs.append(cost := alltoall_cost(self.ledger.spec, load))
            self.ledger.add(cost)
            self.traffic[name].add(load)
            self.booked[name] += cost
            self.links.loads["moe"].add(load)
        return costs[0], costs[1]

    def _balance(self) -> Cost:
        """NI-Balancer's part in this run: a step of the migration under way (booked), the stall of a swap
        moved at once since the last run; every `balance` runs, a look at the histogram of those runs
        (MoEntwine's temporal locality: the next runs route as the last ones did) for a swap to start."""
        cost, self.stall = self.stall, Cost()
        if self.migration is not None:
            cost = cost + self._migration_step()
        self.runs += 1
        if self.balance and self.migration is None and self.runs % self.balance == 0:
            swap = plan_swap(self.seen, self.blocks)
            self.seen[:] = 0
            if swap is not None:
                self.migrate(swap, BALANCE_STEPS)
        return cost

    # -- NI-Balancer (waferrt.decode.balancer) -----------------------------------------------------------
    def swap_traffic(self, swap: Swap) -> LinkLoad:
        """The links the swap's weights cross (each core's share of its expert, to the other block)."""
        a, b = self.blocks[swap.a], self.blocks[swap.b]
        per_core = sum(lay.max_block_bytes() for lay in expert_layouts(self.config, a, self.dtype).values())
        return swap_load(self.region, a, b, per_core)

    def migrate(self, swap: Swap, steps: int = 0) -> Cost:
        """Move the swap's experts: at once (steps 0: the decode stalls for the returned Cost, booked as op
        "migration"), or over the next `steps` micro-batches, a part each (booked inside them)."""
        if steps:
            self.migration = [swap, self.swap_traffic(swap), steps, 0]
            return Cost()
        cost = at_once_cost(self.ledger.spec, self.swap_traffic(swap))
        with self.ledger.op("migration"):
            self.ledger.add(cost)
        self.stall = self.stall + cost
        self._swap(swap)
        return cost

    def _migration_step(self) -> Cost:
        """A part of the migration, each link's bytes during the phase of this micro-batch (its links as
        recorded so far: the attention's all, the MoE's up to its combine) that leaves the link cold."""
        swap, load, steps, done = self.migration
        phases = self.links.since(self.mark).values()
        cost = step_cost(self.ledger.spec, load, steps, list(phases))
        self.ledger.add(cost)
        self.migration[3] = done = done + 1
        if done == steps:  # the last part arrived: the experts compute in their new blocks from now on
            self.migration = None
            self._swap(swap)
            self.swaps.append(swap)
        return cost

    def _swap(self, swap: Swap) -> None:
        blocks = list(self.blocks)
        blocks[swap.a], blocks[swap.b] = blocks[swap.b], blocks[swap.a]
        self.blocks = tuple(blocks)
        self.routes = AllToAll(self.config.dim, self.region, self.blocks)


def run_steps(shard: MoELayerShard, xs: np.ndarray) -> list[MoEStep]:
    """Decode steps through `shard`: xs (steps, B, dim) float32, token b of step t the request in slot b at
    position t; each step's MoEStep as it ran."""
    chunks, out = Chunks(shard.config.dim, shard.region.w), []
    for pos, x in enumerate(xs):
        shard.forward(chunks.split(x), np.arange(len(x)), np.full(len(x), pos))
        out.append(shard.step)
    return out

