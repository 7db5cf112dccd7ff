"""Where the model cannot set a ratio beside a paper's, the row says which side does not fit and why, and the
die-to-die lines name the partition's layout (waferrt.estimator.train_papers; no Ray)."""

from __future__ import annotations

from waferrt.core.template import template_by_name
from waferrt.estimator.train import TrainJob, TrainShape
from waferrt.estimator.train_papers import lines, paper_rows
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


def test_the_sensitivity_names_the_partitions_layout_and_its_contention():
    """The die-to-die line names the layout the step runs and its two terms; the layout table puts TEMP's
    topology-aware 2D partition beside one ring of all the dies and the layouts that ignore the grid."""
    text = "\n".join(lines(_job("smollm2-135m"), template_by_name("temp")))
    assert "die-to-die 0.063 s (2D, gather on die rows (8x6): 0.012 s of its busiest edge's bytes" in text
    assert "one ring's busiest edge carries 3.2x its bytes, and laid out row by row 2.0x the cycle's" in text
    assert "contention TEMP's traffic-conscious mapping avoids" in text


def test_a_ratio_not_reproduced_names_the_dominant_term():
    """TEMP's 1.7x against the model's 6.8x: both steps are bound by the kernels' on-die moves, weight
    streaming's (on the wafer's squares of 96 cores a side) 8.8x tensor-stream's (a die's squares of 32)."""
    temp = paper_rows(_job("smollm2-135m"))[0]
    assert temp.why.startswith("fabric dominates") and "(8.8x)" in temp.why
    assert "on squares of 96 cores a side" in temp.why and "on squares of 32 (bound by fabric)" in temp.why
    assert "fabric per second of compute 5.2 against 1.9" in temp.why
