"""Where the model cannot set a ratio beside a paper's, the row says which side does not fit and why, and the
die-to-die lines name the partition's layout (waferrt.estimator.train_papers; no Ray)."""

from __future__ import annotations

from waferrt.core.template import template_by_name
from waferrt.estimator.train import TrainJob, TrainShape
from waferrt.estimator.train_papers import layout_lines, paper_rows
from waferrt.model.zoo import model_by_name


def _job(model: str) -> TrainJob:
    config, label = model_by_name(model)
    return TrainJob(config, TrainShape(256, 2048), "float16", label)


def test_a_ratio_without_a_fit_names_the_side_and_what_it_needs():
    """Llama3-8B on the temp template: 48 dies of 64x64 cores of 48 KB hold 9.7 GB, its weights 32.1 GB (with
    their gradients): tensor-stream does not fit, and the row says so with the sizes."""
    temp = paper_rows(_job("llama3-8b"))[0]
    assert temp.modelled is None
    assert "tensor-stream does not fit: weights (32.1 GB" in temp.why and "9.7 GB" in temp.why
    assert "per-die DRAM" in temp.why


def test_the_layout_table_names_the_pick_and_its_contention():
    """temp's 6x8 dies: TEMP's topology-aware 2D partition beside one ring of all the dies and the layouts that
    ignore the grid (the die-to-die line naming the pick's two terms: test_train_papers's command test)."""
    text = "\n".join(layout_lines(_job("smollm2-135m"), template_by_name("temp")))
    assert "one ring of neighbours puts 3.2x its bytes on its busiest edge; one ring laid out row by row 6.3x" in text
    assert "contention TEMP's traffic-conscious mapping avoids" in text


def test_dies_odd_by_odd_have_no_cycle_and_the_table_says_so():
    """Dojo's 5x5 dies: no ring of all 25 visits each by a neighbour; the one ring left is laid out row by row,
    its busiest edge 5.7x the 2D partition's."""
    text = "\n".join(layout_lines(_job("smollm2-135m"), template_by_name("dojo")))
    assert "one ring, a cycle of neighbours" not in text and "5x5 dies have no cycle of neighbours" in text
    assert "one ring laid out row by row 5.7x" in text


def test_a_ratio_not_reproduced_names_the_dominant_term():
    """TEMP's 1.7x against the model's 6.8x: both steps are bound by the kernels' on-die moves, weight
    streaming's (on the wafer's squares of 96 cores a side) 8.8x tensor-stream's (a die's squares of 32)."""
    temp = paper_rows(_job("smollm2-135m"))[0]
    assert temp.why.startswith("fabric dominates") and "(8.8x)" in temp.why
    assert "on squares of 96 cores a side" in temp.why and "on squares of 32 (bound by fabric)" in temp.why
    assert "fabric per second of compute 5.2 against 1.9" in temp.why
