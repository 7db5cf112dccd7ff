"""One set of strategy words: `waferrt plan` and `waferrt estimate` (and `waferrt sweep`, which shares
estimate's arguments) accept the same ``--strategy`` words, run the same strategies for them, and refuse
the same words with the same message (what was wrong and what to write).

Each word goes through ``waferrt.cli.main`` in-process, the way a user's command line does, on a 3-layer
llama GGUF (plan on the tiny spec, estimate on the tiny preset): quick, and every case below is one the
model's 3 layers decide (grouped:3 is tensor, grouped:4 is refused after parsing).
"""

from __future__ import annotations

import json

import pytest
from ggufs import write_gguf

from waferrt.cli import main
from waferrt.model import synthetic_llama, tiny_config

WORDS = ("layer", "tensor", "grouped", "grouped:1", "grouped:2", "grouped:3", "grouped:4", "grouped:0",
         "grouped:", "pipeline", "mixed", "tensor:2", "layer:1", "Layer", "")


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    config = tiny_config()
    assert config.n_layers == 3  # the cases above are chosen for 3 layers
    path = tmp_path_factory.mktemp("words") / "tiny.gguf"
    write_gguf(path, config, synthetic_llama(config, seed=1))
    return str(path)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, the one-line complaint without its "waferrt <command>: " and "(see ...)")."""
    try:
        code = main(argv)
    except SystemExit as e:  # refused while parsing
        code = e.code
    out, err = capsys.readouterr()
    line = err.strip().split(": ", 1)[-1].split(" (see waferrt")[0]
    return code, out, line


SWEPT = ("grouped", "grouped:2", "grouped:4", "pipeline")  # sweep draws a PNG: a few words are enough


@pytest.mark.parametrize("word", WORDS)
def test_plan_and_estimate_take_and_refuse_the_same_strategy_words(word, gguf_path, capsys, tmp_path):
    workload = ["--model", gguf_path, "--kv-tokens", "16", "--requests", "2", "--strategy", word, "--json"]
    plan = _run(["plan", *workload, "--spec", "tiny", "--mesh", "16x16", "--tile", "8x8"], capsys)
    est = _run(["estimate", *workload, "--preset", "tiny"], capsys)
    sweep = _run(["sweep", *workload, "--preset", "tiny", "--sram", "16", "--mesh", "64x64", "--png",
                  str(tmp_path / "s.png")], capsys) if word in SWEPT else None
    assert (plan[0] == 2) == (est[0] == 2), (word, plan, est)
    if plan[0] == 2:
        assert plan[2] == est[2] and ("layer, tensor, grouped or grouped:N" in est[2]), (plan[2], est[2])
        assert sweep is None or (sweep[0] == 2 and sweep[2] == est[2])
        return
    assert plan[0] == 0 and est[0] == 0, (word, plan, est)
    planned = json.loads(plan[1])["placement"]["group"]
    estimated = json.loads(est[1])
    assert planned == estimated["layers_per_region"]
    assert estimated["strategy"] == {1: "layer", 2: "grouped", 3: "tensor"}[planned]
    if sweep is not None:
        assert sweep[0] == 0 and json.loads(sweep[1])["best"]["strategy"] == estimated["strategy"]


def test_the_words_refused_are_the_ones_expected(gguf_path, capsys):
    refused = {w for w in WORDS if _run(["estimate", "--model", gguf_path, "--preset", "tiny", "--strategy", w],
                                        capsys)[0] == 2}
    assert refused == {"grouped:4", "grouped:0", "grouped:", "pipeline", "mixed", "tensor:2", "layer:1", "Layer", ""}
