"""`waferrt train` without Ray (the resident mode): the loss falls over the steps, the gradients applied are the
reference's (--check), --save writes a GGUF whose weights are the trained ones and that `generate --reference`
decodes (on the wafer: tests/runtime/test_train_ray.py; bad command lines: test_bad_input_train.py)."""

from __future__ import annotations

import json

import numpy as np

from waferrt.cli import main
from waferrt.model import load_model, synthetic_llama
from waferrt.model.backward import named_arrays


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_tiny_trains_with_a_falling_loss_and_the_references_gradients(capsys):
    out = _json(capsys, ["train", "--model", "tiny", "--steps", "8", "--batch", "2", "--seq", "32", "--check",
                         "--json"])
    losses = [s["loss"] for s in out["steps"]]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses
    assert all(0 < s["grad_error"] < 1e-4 for s in out["steps"])  # the mesh kernels' (float32 sums in another order)
    assert all(s["modelled_s"] > 0 and s["wall_tokens_per_s"] > 0 for s in out["steps"])
    assert not out["streaming"] and out["steps"][0]["bytes_in"] > out["steps"][0]["bytes_out"] > 0


def test_the_reference_backward_applies_the_references_very_gradients(capsys):
    out = _json(capsys, ["train", "--steps", "2", "--batch", "2", "--seq", "16", "--on", "reference", "--check",
                         "--json"])
    # the reference's own backward, checked independently: central differences of its loss at 4 coordinates
    assert all(s["grad_check"] == "finite differences" and 0 < s["grad_error"] < 5e-3 for s in out["steps"])


def test_a_mesh_steps_modelled_time_is_what_its_ledger_booked(capsys):
    """--on mesh prints the cycles the mesh's ledger took for each step (+ AdamW's): a step whose core died and
    was redone on a re-planned square booked both attempts' kernels; the reference's figure is the closed form."""
    argv = ["train", "--model", "tiny", "--steps", "2", "--batch", "2", "--seq", "16", "--mesh", "9x8", "--json"]
    faulted = _json(capsys, [*argv, "--fault", "core:1"])["steps"]
    assert faulted[0]["modelled_s"] > 1.5 * faulted[1]["modelled_s"] > 0
    reference = _json(capsys, [*argv, "--on", "reference"])["steps"]
    assert reference[0]["modelled_s"] == reference[1]["modelled_s"] < faulted[0]["modelled_s"]


def test_the_saved_gguf_holds_the_trained_weights_and_decodes(capsys, tmp_path):
    path = str(tmp_path / "trained.gguf")
    out = _json(capsys, ["train", "--steps", "3", "--batch", "2", "--seq", "16", "--save", path, "--json"])
    assert out["saved"] == path
    config, weights = load_model(path, cache=False)[:2]
    start = synthetic_llama(config, seed=0)  # what --model tiny starts from
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(named_arrays(weights).values(),
                                                            named_arrays(start).values(), strict=True))
    assert 0 < moved < 0.1  # trained: three AdamW steps of lr 3e-3 moved every weight a little
    assert config.vocab_size == 264 and config.n_layers == 3 and weights.tied
    gen = _json(capsys, ["generate", "to be or", "--model", path, "--reference", "--max-new-tokens", "8", "--json"])
    assert gen["tokens"] and len(gen["tokens"]) <= 8
