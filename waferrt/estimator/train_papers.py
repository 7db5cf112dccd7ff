"""The training papers' ratios beside the model's, and what the die-to-die links and the topology change.

Contract (pure): ``paper_rows(job)`` is a :class:`PaperRow` for each ratio a paper reports -- TEMP's 1.7x over
the state of the art (tensor-stream over the best other strategy on the ``temp`` template), WATOS's 1.53x
over Cerebras' weight streaming and 2.74x over Megatron (the best strategy on the ``watos`` template over
weight streaming, and over the 1F1B pipeline: Megatron's pipeline parallelism, the nearest strategy this
model has) -- each with the model's ratio for `job` and, where the two differ by more than 0.75-1.33x (or
the model's cannot be had), the term that bounds the model's steps and the assumption that differs.
``sensitivity(job, template)`` is the tensor-stream step on `template` under each topology and die-to-die
bandwidth of ``D2D_TBPS``, and ``binding_tbps`` the bandwidth per die edge below which the die-to-die
traffic, not the kernels, would bound that step (the traffic overlaps the kernels: above it, 1 or 4 TB/s
changes nothing). ``resources(job, template)`` the same step with the die's (assumed) 16-bit flops per cycle
and SRAM per core scaled by ``SCALES``. ``lines(job, template)`` prints them under ``waferrt estimate --train``.
"""

from __future__ import annotations

from dataclasses import dataclass

from waferrt.core.template import DieLinks, WaferTemplate, template_by_name
from waferrt.core.topology import TOPOLOGIES, Topology

from .train import StrategyTime, TrainJob, estimate_train, tensor_stream

D2D_TBPS = (0.25, 0.5, 1.0, 2.0, 4.0)  # die-to-die bandwidths tried per edge and direction, TB/s
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
    why = (f"{slow.strategy} is bound by {slow.breakdown.bound} ({slow.step_s:.3f} s), {fast.strategy} by "
           f"{fast.breakdown.bound} ({fast.step_s:.3f} s); {assumed}")
    return PaperRow(paper, text, reported, ratio, why)


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


def resources(job: TrainJob, template: WaferTemplate) -> dict[tuple[str, float], StrategyTime]:
    """The tensor-stream step with the die's 16-bit ("flops") or SRAM ("sram") figure per core scaled."""
    die = template.die
    out = {}
    for scale in SCALES:
        out["flops", scale] = tensor_stream(job, template.replace(die=die.replace(
            half_flops_per_cycle=die.half_flops_per_cycle * scale)))
        out["sram", scale] = tensor_stream(job, template.replace(die=die.replace(
            sram_bytes=int(die.sram_bytes * scale))))
    return out


def binding_tbps(st: StrategyTime, template: WaferTemplate) -> float:
    """The die-to-die bandwidth per edge (TB/s) below which `st`'s die-to-die traffic outlasts its kernels."""
    b = st.breakdown
    return template.d2d.bytes_per_s / 1e12 * b.d2d / (b.compute + b.fabric)


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
    b = base.breakdown
    out.append(f"why: the die-to-die all-gather ({b.d2d:.3f} s at {template.d2d.bytes_per_s / 1e12:g} TB/s) overlaps "
               f"the kernels ({b.compute + b.fabric:.3f} s): it bounds the step only below "
               f"{binding_tbps(base, template):.2f} TB/s per edge; the topology changes only the on-die rings' hops "
               f"(alpha, a cycle each: a torus halves a 96-core ring's 380 of its 54,720 cycles) while their routing "
               f"stages and bytes, the same on every topology, take the fabric's {b.fabric:.3f} s; the partition is "
               f"one ring of all {template.n_dies} dies, each hop one die edge at its full rate, so no edge carries "
               "two streams (the contention TEMP's traffic-conscious mapping avoids comes from the concurrent "
               "streams of a 2D partition, which this model does not run)")
    scaled = resources(job, template)
    out += ["", f"tensor-stream on {template.name} with the die's per-core figures scaled (step seconds; no fit: -)",
            f"{'':<24}" + "".join(f"{f'x{k:g}':>9}" for k in SCALES)]
    for kind, label in (("flops", f"16-bit flops/cycle ({template.die.half_flops_per_cycle:g})"),
                        ("sram", f"SRAM per core ({template.die.sram_bytes // 1024} KB)")):
        out.append(f"{label:<24}" + "".join(f"{scaled[kind, k].step_s:>9.3f}" if scaled[kind, k].fits else f"{'-':>9}"
                                            for k in SCALES))
    return out
