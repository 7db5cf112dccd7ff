"""Where the model cannot set a ratio beside a paper's, the row says which side does not fit and why, and the
die-to-die line names the partition's ring (waferrt.estimator.train_papers; no Ray)."""

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


def test_the_sensitivity_names_the_ring_of_dies():
    text = "\n".join(lines(_job("smollm2-135m"), template_by_name("temp")))
    assert "one ring of all 48 dies" in text and "no edge carries two streams" in text
