"""The training papers' ratios beside the model's, and what the die-to-die links and the topology change.

Contract (pure): ``paper_rows(job)`` is a :class:`PaperRow` for each ratio a paper reports -- TEMP's 1.7x over
the state of the art (tensor-stream over the best other strategy on the ``temp`` template), WATOS's 1.53x
over Cerebras' weight streaming and 2.74x over Megatron (the best strategy on the ``watos`` template over
weight streaming, and over the 1F1B pipeline: Megatron's pipeline parallelism, the nearest strategy this
model has) -- each with the model's ratio for `job` and, where the two differ by more than 0.75-1.33x (or
the model's cannot be had), the term that dominates the ratio and the assumption that differs.
``sensitivity(job, template)`` is the tensor-stream step on `template` under each topology and die-to-die
bandwidth of ``D2D_TBPS``, and ``binding_tbps`` the bandwidth per die edge below which the die-to-die
traffic, not the kernels, would bound that step (the traffic overlaps the kernels: above it, faster links
change nothing). ``layout_lines`` the partition's layouts on the die grid (estimator.die_grid) on the mesh
and the torus: the busiest edge's bytes, the longest ring hop, the die-to-die seconds. ``resources(job,
template)`` the same step with the die's (assumed) 16-bit flops per cycle and SRAM per core scaled by
``SCALES``. ``lines(job, template)`` prints them under ``waferrt estimate --train``.
"""

from __future__ import annotations

from dataclasses import dataclass

from waferrt.core.template import SOURCES, DieLinks, Figure, WaferTemplate, template_by_name
from waferrt.core.topology import TOPOLOGIES, Topology

from .die_grid import Layout
from .train import StrategyTime, TrainJob, estimate_train, tensor_stream

D2D_TBPS = (0.025, 0.05, 0.1, 0.25, 1.0, 4.0)  # die-to-die bandwidths tried per edge and direction, TB/s
SCALES = (0.5, 1.0, 2.0)  # the die's assumed per-core figures, scaled
REPRODUCED = (0.75, 1.33)  # a model / paper ratio in this band counts as reproduced (as benchmarks/fidelity.py)


@dataclass(frozen=True)
class Claim:
    """A ratio a paper reports: the paper, what the ratio is of, the ratio."""

    paper: str
    what: str
    reported: float


@dataclass(frozen=True)
class PaperRow:
    paper: str
    claim: str  # what the ratio is of
    reported: float
    modelled: float | None  # None: a side of the ratio does not fit
    why: str = ""  # when not reproduced: the bounding term and the assumption that differs

    def text(self) -> str:
        got = "no fit" if self.modelled is None else f"{self.modelled:.2f}x"
        return f"{self.paper:<6}{self.claim:<44}{self.reported:>9.2f}x{got:>10}  {self.why or 'reproduced'}"


def _by_name(est) -> dict[str, StrategyTime]:
    return {s.strategy: s for s in est.strategies}


def _row(claim: Claim, slow: StrategyTime | None, fast: StrategyTime | None, template: WaferTemplate) -> PaperRow:
    """The ratio slow / fast of the model against the paper's, and why when it is off."""
    paper, text, reported = claim.paper, claim.what, claim.reported
    assumed = (f"the {template.name} template's figures ({template.label()}) are assumed or secondhand "
               "(core/template.py)")
    unfit = [s for s in (slow, fast) if s is not None and not s.fits]
    if slow is None or fast is None or unfit:
        sides = "; ".join(f"{s.strategy} does not fit: {s.detail}" for s in unfit) or "a side does not fit"
        return PaperRow(paper, text, reported, None, f"{sides} (the paper's wafer may hold what this model keeps in "
                        f"SRAM in per-die DRAM, a tier this model lacks); {assumed}")
    ratio = slow.step_s / fast.step_s
    if REPRODUCED[0] <= ratio / reported <= REPRODUCED[1]:
        return PaperRow(paper, text, reported, ratio)
    return PaperRow(paper, text, reported, ratio, f"{_dominant(slow, fast)}; {assumed}")


def _dominant(slow: StrategyTime, fast: StrategyTime) -> str:
    """Which term of the two steps sets their ratio: the slower side's bound, its seconds on both sides."""
    parts = {"compute": lambda b: b.compute, "fabric": lambda b: b.fabric, "die-to-die": lambda b: b.d2d,
             "off-wafer I/O": lambda b: b.io}
    term = max(parts, key=lambda k: parts[k](slow.breakdown))
    a, b = parts[term](slow.breakdown), parts[term](fast.breakdown)
    other = f"{b:.3f} s ({a / b:.1f}x)" if b > 0 else "none"
    why = {"fabric": "the kernels' on-die moves (MeshGEMM's shifts and the reductions along a square's rows)",
           "compute": "the flops at the template's 16-bit rate", "die-to-die": "the die edges' streams",
           "off-wafer I/O": "the weights streamed in and the gradients out"}[term]
    return (f"{term} dominates, {why}: {slow.strategy} {a:.3f} s of its {slow.step_s:.3f} s on squares of "
            f"{slow.square} cores a side (bound by {slow.breakdown.bound}), {fast.strategy} {other} of its "
            f"{fast.step_s:.3f} s on squares of {fast.square} (bound by {fast.breakdown.bound}); fabric per second "
            f"of compute {_per(slow)} against {_per(fast)}")


def _per(st: StrategyTime) -> str:
    return f"{st.breakdown.fabric / st.breakdown.compute:.1f}" if st.breakdown.compute > 0 else "-"


def paper_rows(job: TrainJob) -> list[PaperRow]:
    temp, watos = template_by_name("temp"), template_by_name("watos")
    on_temp, on_watos = _by_name(estimate_train(job, temp)), _by_name(estimate_train(job, watos))
    others = [s for name, s in on_temp.items() if name != "tensor-stream" and s.fits]
    sota = min(others, key=lambda s: s.step_s) if others else None
    fitting = [s for s in on_watos.values() if s.fits]
    best = min(fitting, key=lambda s: s.step_s) if fitting else None
    return [_row(Claim("TEMP", "tensor-stream over the state of the art", 1.7), sota, on_temp.get("tensor-stream"),
                 temp),
            _row(Claim("WATOS", "best over Cerebras weight streaming", 1.53), on_watos.get("weight-streaming"), best,
                 watos),
            _row(Claim("WATOS", "best over Megatron (here: the 1F1B pipeline)", 2.74), on_watos.get("pipeline"),
                 best, watos)]


def sensitivity(job: TrainJob, template: WaferTemplate) -> dict[tuple[str, float], StrategyTime]:
    """The tensor-stream step under every topology x die-to-die bandwidth (TB/s per edge) of D2D_TBPS."""
    latency = template.d2d.latency_s
    return {(t, tbps): tensor_stream(job, template.with_topology(Topology(t)).replace(d2d=DieLinks(tbps * 1e12,
                                                                                                    latency)))
            for t in TOPOLOGIES for tbps in D2D_TBPS}


def _speedup(job: TrainJob, template: WaferTemplate) -> tuple[StrategyTime, float | None]:
    """The tensor-stream step on `template` and its speed-up over the best other strategy (TEMP's claim; None
    when a side does not fit)."""
    on = _by_name(estimate_train(job, template))
    ts, others = on.pop("tensor-stream"), [s for s in on.values() if s.fits]
    return ts, (min(s.step_s for s in others) / ts.step_s if ts.fits and others else None)


def figures(job: TrainJob, template: WaferTemplate) -> dict[tuple[Figure, float], tuple[StrategyTime, float | None]]:
    """For each figure of the template and each scale of SCALES: the tensor-stream step and its speed-up over
    the best other strategy with that figure scaled (core.template.Figure.scaled)."""
    base = _speedup(job, template)
    return {(f, k): base if k == 1.0 else _speedup(job, f.scaled(template, k)) for f in Figure for k in SCALES}


def figure_lines(job: TrainJob, template: WaferTemplate) -> list[str]:
    """The figures' table: each one's value and source (core.template.SOURCES), and what it moves."""
    table, sources = figures(job, template), SOURCES.get(template.name, {})
    out = [f"{template.name}'s figures: the source of each, and the tensor-stream step (s) with its speed-up over "
           "the best other strategy (TEMP reports 1.70x) with the figure halved, as is, doubled (no fit: -)",
           f"{'figure':<30}{'value':>10}  {'source':<11}" + "".join(f"{f'x{k:g}':>15}" for k in SCALES)]
    for f in Figure:
        cells = "".join(f"{st.step_s:>8.3f} {ratio:>5.2f}x" if ratio else f"{'-':>15}"
                        for st, ratio in (table[f, k] for k in SCALES))
        source = sources[f].value if f in sources else "the preset's"
        out.append(f"{f.value:<30}{f.shown(template):>10}  {source:<11}{cells}")
    return out


def binding_tbps(st: StrategyTime, template: WaferTemplate) -> float:
    """The die-to-die bandwidth per edge (TB/s) below which every layout's die-to-die time (its busiest edge's
    bytes at that rate, plus its ring steps' crossings) outlasts `st`'s kernels (inf: even infinitely fast
    links do not hide the crossings; 0 on one die)."""
    kernels, rate = st.breakdown.compute + st.breakdown.fabric, template.d2d.bytes_per_s
    if not st.layouts:
        return 0.0
    crossing = [(lt.busiest_bytes, lt.seconds - lt.busiest_bytes / rate) for lt in st.layouts]
    return min((b / (kernels - c) / 1e12 for b, c in crossing if c < kernels), default=float("inf"))


def layout_lines(job: TrainJob, template: WaferTemplate) -> list[str]:
    """The tensor-stream partition's layouts on the template's die grid, mesh and torus side by side, and why
    the pick is the pick."""
    on = {t: tensor_stream(job, template.with_topology(Topology(t))) for t in ("mesh", "torus")}
    rows = {t: {lt.label(): lt for lt in st.layouts} for t, st in on.items()}
    out = [f"tensor-stream's partition on {template.name}'s {template.dies[0]}x{template.dies[1]} dies: the "
           "busiest die edge (GB a step), the longest ring hop (edges), die-to-die seconds; reduce x gather dies",
           f"{'layout':<40}{'mesh GB':>9}{'hop':>5}{'s':>8}{'torus GB':>10}{'hop':>5}{'s':>8}  mapping"]
    for label, m in rows["mesh"].items():
        t = rows["torus"][label]
        aware = "topology-aware" if m.partition.layout.aware else "ignores the grid"
        out.append(f"{label:<40}{m.busiest_bytes / 1e9:>9.2f}{m.longest_hop:>5}{m.seconds:>8.3f}"
                   f"{t.busiest_bytes / 1e9:>10.2f}{t.longest_hop:>5}{t.seconds:>8.3f}  {aware}")
    best = on["mesh"].layout
    ring = {lt.partition.layout: lt for lt in rows["mesh"].values() if len(lt.partition.reduce[0]) == 1}
    cycle, crowded = ring.get(Layout.RING_CYCLE), ring.get(Layout.RING_ROW_MAJOR)
    said = [f"picked on the mesh: {best.label()}"]
    if cycle:
        said.append(f"one ring of neighbours puts {cycle.busiest_bytes / best.busiest_bytes:.1f}x its bytes on its "
                    "busiest edge")
    if crowded:
        said.append(f"one ring laid out row by row {crowded.busiest_bytes / best.busiest_bytes:.1f}x (its row "
                    "changes run back along the rows: two streams share each row edge, the contention TEMP's "
                    "traffic-conscious mapping avoids)" + ("" if cycle else f"; {template.dies[0]}x{template.dies[1]}"
                                                         " dies have no cycle of neighbours"))
    out.append("; ".join(said))
    return out


def lines(job: TrainJob, template: WaferTemplate) -> list[str]:
    out = ["", "the papers' ratios beside the model's (same job; a ratio within 0.75-1.33x of the paper's counts as "
           "reproduced)", f"{'paper':<6}{'ratio of':<44}{'reported':>10}{'model':>10}  why not"]
    out += [r.text() for r in paper_rows(job)]
    if template.n_dies == 1 or template.d2d is None:
        return out + ["", f"die-to-die sensitivity: {template.name} is one die (no die-to-die links)"]
    table = sensitivity(job, template)
    base = table.get(("mesh", template.d2d.bytes_per_s / 1e12)) or tensor_stream(job, template)
    if not base.fits:
        return out + ["", f"die-to-die sensitivity: tensor-stream does not fit {template.name} ({base.detail})"]
    out += ["", f"tensor-stream on {template.name}: step seconds by topology (rows) and die-to-die TB/s per edge",
            f"{'':<12}" + "".join(f"{tbps:>9g}" for tbps in D2D_TBPS)]
    out += [f"{t:<12}" + "".join(f"{table[t, tbps].step_s:>9.3f}" for tbps in D2D_TBPS) for t in TOPOLOGIES]
    b, lt = base.breakdown, base.layout
    rate = template.d2d.bytes_per_s
    torus = table.get(("torus", template.d2d.bytes_per_s / 1e12)) or base
    out.append(f"why: the step is max(kernels, die-to-die) + I/O; the kernels take {b.compute + b.fabric:.3f} s "
               f"(compute {b.compute:.3f}, fabric {b.fabric:.3f}), the die-to-die {b.d2d:.3f} s ({lt.label()}: "
               f"{lt.busiest_bytes / rate:.3f} s of its busiest edge's bytes, {b.d2d - lt.busiest_bytes / rate:.3f} s "
               f"of its ring steps' crossings at {template.d2d.latency_s * 1e9:g} ns); the links bind only below "
               f"{binding_tbps(base, template):.3f} TB/s per edge on the mesh, "
               f"{binding_tbps(torus, template):.3f} on the torus, whose wraps close every row and column of dies "
               "(half the bytes on each edge, one edge a hop): there a torus's step is the shorter; above it the "
               "topology and the bandwidth change only the die-to-die seconds the kernels hide")
    out += [""] + layout_lines(job, template)
    return out + [""] + figure_lines(job, template)
