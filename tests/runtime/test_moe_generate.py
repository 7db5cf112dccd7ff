"""`waferrt generate` of a mixture of experts on Ray: a tiny MoE GGUF (written by `waferrt convert --moe`)
decodes with the reference's tokens under both expert mappings and while NI-Balancer moves experts."""

import dataclasses
import json

import pytest
from ggufs import write_gguf

from waferrt.cli import main
from waferrt.model import synthetic_llama, tiny_config
from waferrt.model.gguf_writer import Vocab

WAFER = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "48", "--requests", "2"]


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    config = dataclasses.replace(tiny_config(), vocab_size=264)
    write_gguf(d / "dense.gguf", config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    assert main(["convert", "--moe", "4,2", "--model", str(d / "dense.gguf"), str(d / "moe.gguf")]) == 0
    return str(d / "moe.gguf")


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_both_mappings_decode_the_reference_tokens(ray_session, moe_gguf, capsys):
    argv = ["generate", "hello world", "to be or", "--model", moe_gguf, "--max-new-tokens", "10",
            "--temperature", "0.7", "--seed", "3", "--json"]
    ref = _json(capsys, argv + ["--reference"])
    for extra in (["--experts", "er"], ["--experts", "naive"], ["--balance", "1"]):  # NI-Balancer swapping as it goes
        wafer = _json(capsys, argv + WAFER + extra)
        assert wafer["tokens"] == ref["tokens"], extra
        assert (wafer["expert_swaps"] is None) == ("--balance" not in extra)
    assert wafer["expert_swaps"] > 0  # experts moved on the tiles while the decode went on, tokens unchanged
    assert all(0 < len(t) <= 10 for t in ref["tokens"])
