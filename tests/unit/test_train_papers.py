"""The training papers' ratios beside the model's and the die-to-die sensitivity (waferrt.estimator.train_papers,
`waferrt estimate --train`): the ratios are the model's steps on the papers' templates, the die-to-die links
bound the tensor-stream step below the bandwidth the table names, and the command prints both."""

from __future__ import annotations

import json

import pytest

from waferrt.cli import main
from waferrt.core.template import template_by_name
from waferrt.core.topology import Topology
from waferrt.core.train_cost import TrainShape
from waferrt.estimator.die_grid import DieGrid, Layout, LinkTime, partition
from waferrt.estimator.train import Breakdown, StrategyTime, TrainJob, estimate_train, tensor_stream
from waferrt.estimator.train_papers import D2D_TBPS, binding_tbps, paper_rows, resources, sensitivity
from waferrt.model.zoo import model_by_name


def _job(model="smollm2-135m", batch=256, seq=2048) -> TrainJob:
    config, label = model_by_name(model)
    return TrainJob(config, TrainShape(batch, seq), "float16", label)


def test_the_binding_bandwidth_by_hand():
    """Kernels of 1.0 + 0.5 s; two layouts at 2 TB/s: 0.2 TB on the busiest edge plus 0.5 s of crossings, and
    0.1 TB plus 1.4 s. The first hides under the kernels down to 0.2 TB / (1.5 - 0.5) s = 0.2 TB/s, the
    second to 0.1 / 0.1 = 1 TB/s: the links bind below 0.2 TB/s. With crossings alone over 1.5 s: at any rate."""
    grid = DieGrid((2, 2), Topology("mesh"))
    part = partition(grid, Layout.RING_CYCLE)
    layouts = (LinkTime(part, 0.2e12, 1, 0.1 + 0.5), LinkTime(part, 0.1e12, 1, 0.05 + 1.4))
    st = StrategyTime("tensor-stream", True, 1.5, Breakdown(1.0, 0.5, 0.6, 0.0), 0, "", layouts=layouts)
    assert binding_tbps(st, template_by_name("watos")) == pytest.approx(0.2)
    late = StrategyTime("tensor-stream", True, 1.6, Breakdown(1.0, 0.5, 1.6, 0.0), 0, "",
                        layouts=(LinkTime(part, 0.2e12, 1, 0.1 + 1.5),))
    assert binding_tbps(late, template_by_name("watos")) == float("inf")


def test_the_papers_ratios_are_the_models_steps_on_the_papers_templates():
    job = _job()
    rows = paper_rows(job)
    assert [(r.paper, r.reported) for r in rows] == [("TEMP", 1.7), ("WATOS", 1.53), ("WATOS", 2.74)]
    temp = {s.strategy: s for s in estimate_train(job, template_by_name("temp")).strategies}
    sota = min(temp["weight-streaming"].step_s, temp["pipeline"].step_s)
    assert rows[0].modelled == pytest.approx(sota / temp["tensor-stream"].step_s)
    assert "bound by" in rows[0].why and "assumed" in rows[0].why  # 6.8x: not reproduced, and says why
    assert rows[2].why == ""  # 3.07x against 2.74x: within 0.75-1.33


def test_the_die_to_die_links_bound_the_step_only_below_the_named_bandwidth():
    """The d2d traffic overlaps the kernels: slower links change the step only below binding_tbps; a torus's
    wrap never makes it slower."""
    job, template = _job(), template_by_name("temp")
    table = sensitivity(job, template)
    base = tensor_stream(job, template)
    bind = binding_tbps(base, template)
    kernels = base.breakdown.compute + base.breakdown.fabric
    for tbps in D2D_TBPS:
        step = table["mesh", tbps].step_s - base.breakdown.io
        assert (step > kernels * 1.01) == (tbps < bind), tbps
        assert table["torus", tbps].step_s <= table["mesh", tbps].step_s
    assert table["mesh", 0.025].step_s > 4 * table["mesh", 4.0].step_s
    assert table["torus", 0.025].step_s < 0.55 * table["mesh", 0.025].step_s  # the wraps halve the busiest edge


def test_estimate_train_prints_the_papers_and_the_sensitivity(capsys):
    assert main(["estimate", "--train", "--model", "smollm2-135m", "--template", "temp"]) == 0
    out = capsys.readouterr().out
    for words in ("the papers' ratios beside the model's", "TEMP  tensor-stream over the state of the art",
                  "1.70x", "1.53x", "2.74x", "step seconds by topology", "torus", "the links bind only below",
                  "fabric dominates", "2D, gather on die rows (8x6)", "ignores the grid"):
        assert words in out, words
    assert main(["estimate", "--train", "--model", "smollm2-135m", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["reported"] for p in doc["papers"]] == [1.7, 1.53, 2.74]


def test_the_dies_assumed_figures_scaled_move_the_step():
    """The watos die's figures are assumed: with its 16-bit rate halved or doubled a compute-bound
    tensor-stream step (SmolLM2, 256 x 2048) lengthens or shortens; its SRAM changes the passes, each pass
    an even share of the batch (estimator.train._micro_batch)."""
    job, template = _job(), template_by_name("watos")
    scaled = resources(job, template)
    assert tensor_stream(job, template).breakdown.bound == "compute"
    assert scaled["flops", 0.5].step_s > scaled["flops", 1.0].step_s > scaled["flops", 2.0].step_s
    assert scaled["flops", 1.0] == scaled["sram", 1.0] == tensor_stream(job, template)
    assert "15 pass(es)" in scaled["sram", 0.5].detail and "7 pass(es)" in scaled["sram", 1.0].detail
    # twice the SRAM holds 81 sequences: 4 passes, the 256 spread evenly (64 each, not 4 x 81 = 324 sequences' work)
    assert "4 pass(es) of 64 sequence(s)" in scaled["sram", 2.0].detail
    assert scaled["sram", 2.0].step_s < scaled["sram", 1.0].step_s
