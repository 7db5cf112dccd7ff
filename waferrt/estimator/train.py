"""Training on paper: one optimizer step of a Llama model on a wafer template, under three strategies.

Contract (pure): ``estimate_train(job, template, objective)`` returns a :class:`TrainEstimate` -- for each of
weight streaming, a resident pipeline and tensor-stream partition a :class:`StrategyTime` (step seconds,
tokens/s, model-flops utilisation, the :class:`Breakdown` in seconds -- compute, fabric (on-die routes),
die-to-die, off-wafer I/O -- and what bounds it, or why it does not fit) and the one the planner picks for
the objective ("throughput": the shortest step; "memory": the least SRAM per core, then the shortest step),
with why. A step is ``job.shape``: B sequences of S tokens (forward, backward, Adam update).

The strategies (docs/ESTIMATES.md "Training"):
- weight streaming (Cerebras): weights and optimizer state off the wafer; every layer's weights stream in for
  the forward and again for the backward, its gradients stream out (``io``); every core works on every layer
  (tensor parallel over the whole wafer); compute, fabric and I/O overlap (double-buffered).
- resident pipeline: the layers in R stages (bands of columns), weights and gradients resident (the optimizer
  state too when it fits, else streamed), micro-batches in 1F1B order: (M + R - 1) stage slots, a stage holding
  up to R micro-batches' activations; R is searched.
- tensor-stream partition (TEMP): weights resident, each die holding 1/dies of every layer (a block of every
  weight); X streams round rings of dies and the partial Y is reduce-scattered round others, both laid out on
  the die grid by ``estimator.die_grid`` (one ring of all the dies, or TEMP's 2D partition on the rows and
  columns of dies, topology-aware or not), the layout whose busiest die edge and ring hops take least; within
  a die the partial sums are reduced along its rows.

Tensor parallel GEMMs on a w x h grid reduce every output along the rows: ``core.cost.allreduce_cost`` (ring,
over the spec's topology) of a line's share; a ring that crosses die edges is bounded by the edges
(``line_d2d_seconds``). Flops to time: ``core.cost.flop_cycles``. Bytes of weights and activations at the
storage dtype: ``core.dtypes.itemsize``. A ring's latency is paid once per GEMM (the token chunks pipeline).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from waferrt.core.cost import cycles_seconds, flop_cycles, message_cycles
from waferrt.core.dtypes import check_dtype, itemsize
from waferrt.core.template import WaferTemplate
from waferrt.core.train_cost import ADAMW_FLOPS, HeadTooLarge, TrainShape
from waferrt.model.config import LlamaConfig

from .die_grid import LinkTime, stream_d2d, stream_traffic
from .train_layer import Grid, PassCost, Work, pass_costs

STRATEGIES = ("weight-streaming", "pipeline", "tensor-stream")
TRAIN_OBJECTIVES = ("throughput", "memory")
# Mixed-precision Adam: 16-bit weights and gradients plus float32 master weights, momentum and variance =
# 2 + 2 + 12 bytes per parameter (Rajbhandari et al., "ZeRO", SC'20, sec. 3.1).
STATE_BYTES = 16


@dataclass(frozen=True)
class TrainJob:
    """A training step of `config` on the global batch `shape` (B sequences of S tokens), stored at `dtype`."""

    config: LlamaConfig
    shape: TrainShape
    dtype: str = "bfloat16"
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.shape, TrainShape):
            raise TypeError(f"TrainJob.shape is a core.train_cost.TrainShape(batch, seq), got {self.shape!r}")
        check_dtype(self.dtype)
        if self.shape.seq > self.config.max_seq_len:
            raise ValueError(f"--seq {self.shape.seq:,} is more than the model's context of "
                             f"{self.config.max_seq_len:,} positions; give at most --seq {self.config.max_seq_len}")


@dataclass(frozen=True)
class Breakdown:
    """Seconds of one step spent on each resource: compute and fabric are the kernels' (their flops and their
    moves, one after the other: estimator.train_layer); die-to-die and I/O overlap them where streamed."""

    compute: float
    fabric: float
    d2d: float
    io: float

    @property
    def bound(self) -> str:
        kernels = "compute" if self.compute >= self.fabric else "fabric"
        parts = {kernels: self.compute + self.fabric, "die-to-die": self.d2d, "off-wafer I/O": self.io}
        return max(parts, key=parts.get)

    def row(self) -> dict:
        return {"compute_s": self.compute, "fabric_s": self.fabric, "d2d_s": self.d2d, "io_s": self.io,
                "bound": self.bound}


@dataclass(frozen=True)
class StrategyTime:
    strategy: str
    fits: bool
    step_s: float  # inf when it does not fit
    breakdown: Breakdown
    sram_per_core: int  # bytes the fullest core needs
    detail: str  # how it runs (stages, micro-batches, bubble) or why it does not fit
    mfu: float = 0.0
    tokens_per_s: float = 0.0
    square: int = 0  # the side of the squares its kernels run on (0: it does not fit)
    # tensor-stream: its partition's layouts on the die grid, fastest first
    layouts: tuple[LinkTime, ...] = dataclasses.field(default=(), repr=False)

    @property
    def layout(self) -> LinkTime | None:
        """The layout a tensor-stream step runs (the traffic-conscious mapping's pick), None on one die."""
        return self.layouts[0] if self.layouts else None

    def row(self) -> dict:
        return {"strategy": self.strategy, "fits": self.fits, "step_s": self.step_s if self.fits else None,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "sram_per_core": self.sram_per_core,
                "detail": self.detail, **self.breakdown.row(),
                **({"layout": self.layout.label(), "busiest_edge_bytes": self.layout.busiest_bytes}
                   if self.layout else {})}


def model_flops_per_token(config: LlamaConfig, seq: int) -> float:
    """Training flops of one token (forward + backward = 3x the forward): 2 per weight a token uses (its
    layers' active weights and the head) and causal attention's 2 * seq * dim per layer (QK and PV over half
    the positions on average) -- the model flops of PaLM's MFU (Chowdhery et al., 2022, appendix B)."""
    weights = config.n_layers * config.layer_params(active=True) + config.vocab_size * config.dim
    return 3 * (2 * weights + config.n_layers * 2 * seq * config.dim)


def activation_bytes(config: LlamaConfig, dtype: str) -> int:
    """Bytes one token keeps per layer for the backward: the inputs of its GEMMs and norms (the residual
    twice, q/k/v, the attention's output, gate, up and their product), at `dtype`; attention scores are not
    kept (recomputed, FlashAttention-style)."""
    return itemsize(dtype) * (6 * config.dim + 2 * config.kv_dim + 3 * config.dense_hidden)


def line_d2d_seconds(template: WaferTemplate, n: int, line_bytes: float) -> float:
    """A ring allreduce of `line_bytes` along a row of n cores that crosses die edges: every edge carries its
    die's rows' traffic, 2(n-1)/n of each line's bytes, at the edge's rate, and every ring step pays the
    crossing's latency. Zero when the row stays inside one die."""
    die_w, die_h = template.die.full_mesh
    if template.d2d is None or n <= die_w:
        return 0.0
    return 2 * (n - 1) / n * line_bytes * die_h / template.d2d.bytes_per_s + 2 * (n - 1) * template.d2d.latency_s


@dataclass(frozen=True)
class KernelTime:
    """A pass's kernels on a grid: compute, fabric and die-to-die seconds, on `squares` squares of `side` x
    `side` cores."""

    compute: float
    fabric: float
    d2d: float
    side: int
    squares: int

    @property
    def seconds(self) -> float:
        return self.compute + self.fabric + self.d2d

    def scaled(self, k: float) -> KernelTime:
        return dataclasses.replace(self, compute=self.compute * k, fabric=self.fabric * k, d2d=self.d2d * k)


def _kernels(job: TrainJob, template: WaferTemplate, work: Work, grid: Grid) -> KernelTime:
    """A pass of `work` on a w x h grid: the emulator's closed forms composed (estimator.train_layer.pass_costs),
    on the squares' side for which compute, fabric and die-to-die take least together (a larger square can
    cross die edges that a smaller one stays inside; :func:`_d2d`)."""
    spec = template.spec
    options = []
    for cost in pass_costs(spec, work, grid):
        compute, fabric = cost.seconds(spec, job.dtype)
        options.append(KernelTime(compute, fabric, _d2d(template, grid, cost, fabric), cost.side, cost.squares))
    return min(options, key=lambda k: k.seconds)


def _d2d(template: WaferTemplate, grid: Grid, cost: PassCost, fabric: float) -> float:
    """Die-to-die seconds of a pass on the grid's squares of `cost.side`, its kernels' fabric taking `fabric`
    seconds: when the grid spans die edges, the gradients' ring over the squares crosses them
    (:func:`line_d2d_seconds`), and when its squares do too, an edge carries what its die's mesh links across
    it carry during the fabric time, at the edge's rate (ASSUMED: the kernels' moves spread evenly over the
    grid's lines). Zero on one die."""
    spec, (die_w, die_h) = template.spec, template.die.full_mesh
    if template.d2d is None or (grid.w <= die_w and grid.h <= die_h):
        return 0.0
    inside = die_w % cost.side == 0 and die_h % cost.side == 0  # every square within a die
    edge = 0.0 if inside else die_h * spec.link_bytes_per_cycle * spec.clock_hz / template.d2d.bytes_per_s
    ring = line_d2d_seconds(template, max(grid.w, grid.h), cost.grad_bytes) if cost.squares > 1 else 0.0
    return fabric * edge + ring


def _adam_s(job: TrainJob, template: WaferTemplate, cores: int, params: float) -> float:
    """The optimizer's update of `params` spread over `cores`."""
    return cycles_seconds(template.die, flop_cycles(template.die, ADAMW_FLOPS * params / cores, job.dtype))


def _timed(st: StrategyTime, job: TrainJob, template: WaferTemplate) -> StrategyTime:
    """With tokens/s and model-flops utilisation filled in from the step time."""
    if not st.fits:
        return st
    flops = model_flops_per_token(job.config, job.shape.seq) * job.shape.tokens
    mfu = flops / (st.step_s * template.peak_flops_per_s(job.dtype))
    return dataclasses.replace(st, mfu=mfu, tokens_per_s=job.shape.tokens / st.step_s)


def _micro_batch(job: TrainJob, free: float, per_sequence: float) -> int:
    """Sequences per micro-batch: as few passes as the most whose activations fit in `free` bytes allow, the
    batch spread evenly over them (0: not even one fits); never more sequences' work than the batch."""
    if per_sequence <= 0 or free < per_sequence:
        return 0
    batch = job.shape.batch
    return -(-batch // -(-batch // int(min(batch, free // per_sequence))))


def _head_refused(strategy: str):
    """A strategy's timing that says it does not fit, naming the bytes, when the head's backward does not fit
    its squares' cores even in chunks of the vocabulary (``core.train_cost.HeadTooLarge``)."""
    def wrap(timing):
        @functools.wraps(timing)
        def timed(job: TrainJob, template: WaferTemplate, *more) -> StrategyTime:
            try:
                return timing(job, template, *more)
            except HeadTooLarge as e:
                return StrategyTime(strategy, False, float("inf"), Breakdown(0, 0, 0, 0), 0, str(e))
        return timed
    return wrap


@_head_refused("weight-streaming")
def weight_streaming(job: TrainJob, template: WaferTemplate) -> StrategyTime:
    config, cores = job.config, template.cores
    params = config.params()
    per_seq = job.shape.seq * config.n_layers * activation_bytes(config, job.dtype)  # all layers', for the backward
    buffer = 2 * itemsize(job.dtype) * config.layer_params() / cores  # a layer's weights, double-buffered
    mb = _micro_batch(job, template.sram_bytes() - buffer * cores, per_seq)
    io = 3 * params * itemsize(job.dtype) / template.die.ingress_bytes_per_s  # weights in twice, gradients out
    if mb == 0:
        return StrategyTime("weight-streaming", False, float("inf"), Breakdown(0, 0, 0, io),
                            round(buffer + per_seq / cores), f"one sequence's activations ({per_seq / 1e9:.1f} GB) "
                            f"do not fit in the wafer's {template.sram_bytes() / 1e9:.1f} GB of SRAM")
    passes = -(-job.shape.batch // mb)
    k = _kernels(job, template, Work(config, config.n_layers, mb, job.shape.seq, job.dtype),
                 Grid(*template.mesh)).scaled(passes)
    compute, fabric, d2d = k.compute, k.fabric, k.d2d
    bd = Breakdown(compute, fabric, d2d, io * passes)  # the weights stream in once per micro-batch
    step = max(bd.compute + bd.fabric, bd.d2d, bd.io)  # the kernels serialise; the streaming overlaps them
    return StrategyTime("weight-streaming", True, step, bd, round(buffer + mb * per_seq / cores),
                        f"{passes} pass(es) of {mb} sequence(s); weights streamed in each pass{_on(k)}", square=k.side)


@dataclass(frozen=True)
class Resident:
    """What a resident strategy keeps on the wafer: bytes per parameter, the off-wafer I/O a step pays for what
    it does not keep, and where the optimizer state is (said in the strategy's reason)."""

    per_param: float
    io_s: float
    where: str


def _resident(job: TrainJob, template: WaferTemplate) -> Resident:
    """The optimizer state stays on the wafer when weights, gradients and state fit in half its SRAM, else it
    stays off the wafer and the gradients stream out and the updated weights back in every step."""
    params, b = job.config.params(), itemsize(job.dtype)
    if params * STATE_BYTES <= template.sram_bytes() / 2:
        return Resident(STATE_BYTES, 0.0, "optimizer state on the wafer")
    return Resident(2 * b, 2 * params * b / template.die.ingress_bytes_per_s, "optimizer state off the wafer")


def pipeline(job: TrainJob, template: WaferTemplate) -> StrategyTime:
    """The best resident 1F1B pipeline over R >= 2 stages (R dividing the layers, at most the wafer's width)."""
    config, w = job.config, template.mesh[0]
    resident = _resident(job, template)
    tried = [_pipeline_at(job, template, r, resident)
             for r in range(min(2, config.n_layers), config.n_layers + 1) if config.n_layers % r == 0 and r <= w]
    fit = [t for t in tried if t.fits]
    return min(fit, key=lambda t: t.step_s) if fit else min(tried, key=lambda t: t.sram_per_core)


@_head_refused("pipeline")
def _pipeline_at(job: TrainJob, template: WaferTemplate, r: int, resident: Resident) -> StrategyTime:
    config, (w, h) = job.config, template.mesh
    per_param, io, where = resident.per_param, resident.io_s, resident.where
    stage_cores = (w // r) * h
    weights = config.params() * per_param / r  # one stage's share (the embedding and head spread with them)
    act = job.shape.seq * (config.n_layers // r) * activation_bytes(config, job.dtype)  # a sequence, a stage's layers
    free = template.sram_bytes() / r - weights
    mb = _micro_batch(job, free / r, act)  # the first stage holds r micro-batches in flight (1F1B)
    need = round((weights + r * max(mb, 1) * act) / stage_cores)
    if mb == 0:
        return StrategyTime("pipeline", False, float("inf"), Breakdown(0, 0, 0, io), need,
                            f"{r} stage(s): weights ({weights / 1e9:.1f} GB per stage, {where}) and {r} micro-batch(es)"
                            f" of activations do not fit a stage's {template.sram_bytes() / r / 1e9:.1f} GB")
    m = -(-job.shape.batch // mb)
    slots = m + r - 1
    work = Work(config, config.n_layers // r, mb, job.shape.seq, job.dtype)  # the last stage's, with the head
    k = _kernels(job, template, work, Grid(w // r, h))
    compute, fabric, d2d = k.compute, k.fabric, k.d2d
    compute += _adam_s(job, template, stage_cores, config.params() / r / m)
    hand = 2 * mb * job.shape.seq * config.dim * itemsize(job.dtype)  # activations forward, gradients back
    fabric += cycles_seconds(template.spec, message_cycles(template.spec, 1, 1, hand / h))
    d2d += _handover_d2d(template, r, hand)
    slot = max(compute + fabric, d2d)
    bd = Breakdown(compute * slots, fabric * slots, d2d * slots, io)
    return StrategyTime("pipeline", True, slot * slots + io, bd, need,
                        f"{r} stage(s), {m} micro-batch(es) of {mb}, bubble {(r - 1) / slots:.0%}, {where}{_on(k)}",
                        square=k.side)


def _handover_d2d(template: WaferTemplate, r: int, nbytes: float) -> float:
    """Seconds a stage boundary that is a die edge takes to pass `nbytes` (the edge's rate and latency);
    zero when no stage boundary falls on a die edge."""
    if template.d2d is None or template.dies[0] == 1 or r == 1:
        return 0.0
    return nbytes / template.d2d.bytes_per_s + template.d2d.latency_s


@_head_refused("tensor-stream")
def tensor_stream(job: TrainJob, template: WaferTemplate) -> StrategyTime:
    config, cores, dies = job.config, template.cores, template.n_dies
    resident = _resident(job, template)
    per_param, io, where = resident.per_param, resident.io_s, resident.where
    weights = config.params() * per_param
    per_seq = job.shape.seq * config.n_layers * activation_bytes(config, job.dtype)
    mb = _micro_batch(job, template.sram_bytes() - weights, per_seq)
    need = round((weights + max(mb, 1) * per_seq) / cores)
    if mb == 0:
        return StrategyTime("tensor-stream", False, float("inf"), Breakdown(0, 0, 0, io), need,
                            f"weights ({weights / 1e9:.1f} GB, {where}) and one sequence's activations do not fit "
                            f"in the wafer's {template.sram_bytes() / 1e9:.1f} GB")
    passes = -(-job.shape.batch // mb)
    k = _die_kernels(job, template, mb)
    compute, fabric = k.compute, k.fabric
    compute = passes * compute / dies + _adam_s(job, template, cores, config.params())  # a die: its 1/dies share
    fabric = passes * fabric / dies
    traffic = stream_traffic(job.config, job.shape.tokens, job.dtype, passes)
    layouts = tuple(sorted(stream_d2d(template, traffic), key=lambda t: t.seconds))
    bd = Breakdown(compute, fabric, layouts[0].seconds if layouts else 0.0, io)
    laid = f" as {layouts[0].label()}" if layouts else ""
    return StrategyTime("tensor-stream", True, max(bd.compute + bd.fabric, bd.d2d) + io, bd, need,
                        f"{dies} die(s){laid}, {passes} pass(es) of {mb} sequence(s), {where}{_on(k)} a die",
                        square=k.side, layouts=layouts)


def _die_kernels(job: TrainJob, template: WaferTemplate, mb: int) -> KernelTime:
    """The kernels of a pass of `mb` sequences on a die's square(s); when the head's jobs over
    them overflow a die's cores, the kernels of half as many, and so on, scaled up (ASSUMED linear in the
    sequences, as a die's 1/dies share is): more dies' SRAM holds a larger micro-batch, never a refusal."""
    kb = mb
    while True:
        try:
            work = Work(job.config, job.config.n_layers, kb, job.shape.seq, job.dtype)
            return _kernels(job, template, work, Grid(*template.die.full_mesh)).scaled(mb / kb)
        except HeadTooLarge:
            if kb == 1:
                raise
            kb //= 2


def _on(k: KernelTime) -> str:
    return f", on {k.squares} square(s) of {k.side}x{k.side} cores"


@dataclass(frozen=True)
class TrainEstimate:
    job: TrainJob
    template: WaferTemplate
    strategies: tuple[StrategyTime, ...]
    objective: str
    chosen: StrategyTime | None
    why: str

    def text(self) -> str:
        j = self.job
        lines = [f"{j.label or 'model'} training on {self.template.label()}: {j.shape.batch} x {j.shape.seq} tokens "
                 f"per step, {j.dtype}",
                 f"{'strategy':<18}{'step s':>10}{'tokens/s':>12}{'MFU':>7}{'compute':>10}{'fabric':>10}"
                 f"{'d2d':>10}{'I/O':>10}{'KB/core':>9}  bound / how"]
        for s in self.strategies:
            b = s.breakdown
            step = f"{s.step_s:>10.3f}{s.tokens_per_s:>12,.0f}{s.mfu:>7.1%}" if s.fits else f"{'no fit':>10}{'':>19}"
            how = f"{b.bound}; {s.detail}" if s.fits else s.detail
            lines.append(f"{s.strategy:<18}{step}{b.compute:>10.3f}{b.fabric:>10.3f}{b.d2d:>10.3f}{b.io:>10.3f}"
                         f"{s.sram_per_core / 1024:>9,.1f}  {how}")
        pick = self.chosen.strategy if self.chosen else "none"
        lines.append(f"chosen ({self.objective}): {pick} -- {self.why}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"model": self.job.label, "template": self.template.label(), "global_batch": self.job.shape.batch,
                "seq": self.job.shape.seq, "dtype": self.job.dtype, "objective": self.objective,
                "strategies": [s.row() for s in self.strategies],
                "chosen": self.chosen.strategy if self.chosen else None, "why": self.why}


def choose(strategies: tuple[StrategyTime, ...], objective: str) -> tuple[StrategyTime | None, str]:
    """The strategy the objective prefers among those that fit, and why."""
    if objective not in TRAIN_OBJECTIVES:
        raise ValueError(f"a training objective is one of {', '.join(TRAIN_OBJECTIVES)}, got {objective!r}")
    fit = [s for s in strategies if s.fits]
    if not fit:
        return None, "no strategy fits: " + "; ".join(f"{s.strategy}: {s.detail}" for s in strategies)
    if objective == "memory":
        best = min(fit, key=lambda s: (s.sram_per_core, s.step_s))
        return best, f"it needs the least SRAM per core ({best.sram_per_core / 1024:,.1f} KB) of those that fit"
    best = min(fit, key=lambda s: s.step_s)
    others = [s for s in fit if s is not best]
    vs = ", ".join(f"{s.strategy} takes {s.step_s / best.step_s:.2f}x as long" for s in others)
    return best, f"the shortest step, bound by {best.breakdown.bound}" + (f"; {vs}" if vs else "")


def estimate_train(job: TrainJob, template: WaferTemplate, objective: str = "throughput") -> TrainEstimate:
    strategies = tuple(_timed(f(job, template), job, template) for f in (weight_streaming, pipeline, tensor_stream))
    chosen, why = choose(strategies, objective)
    return TrainEstimate(job, template, strategies, objective, chosen, why)
