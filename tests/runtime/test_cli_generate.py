"""`waferrt generate` end to end on a small GGUF written here: the wafer and --reference print the same
tokens, text streams, several prompts are concurrent requests (bad input: tests/unit/test_bad_input_cli.py)."""

import dataclasses
import json

import pytest
from ggufs import Vocab, write_gguf
from tracecheck import check_handovers, check_trace

from waferrt.cli import main
from waferrt.model import synthetic_llama, tiny_config

WAFER = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "48", "--requests", "2"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    config = dataclasses.replace(tiny_config(), vocab_size=264)  # the 256 bytes, "Ġt", unused ones
    write_gguf(path, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    return str(path)


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_on_the_wafer_equals_the_reference(ray_session, tiny_gguf, capsys):
    argv = ["generate", "hello world", "to be or", "abc", "--model", tiny_gguf, "--max-new-tokens", "12",
            "--temperature", "0.7", "--seed", "3", "--json"]
    assert main(argv + WAFER) == 0  # the prompts through the decode's GEMVs (the default)
    got = capsys.readouterr()
    wafer = json.loads(got.out)
    assert "prompts through the decode's GEMVs (--prefill: by MeshGEMM)" in got.err
    ref = _json(capsys, argv + ["--reference"])
    assert wafer["tokens"] == ref["tokens"] and wafer["text"] == ref["text"]
    assert len(wafer["tokens"]) == 3 and all(0 < len(t) <= 12 for t in wafer["tokens"])
    assert wafer["prompt_tokens"][0] == ref["prompt_tokens"][0] and wafer["prompt_tokens"][0]
    assert wafer["wafer_tokens_per_s"] > 0 and wafer["wall_tokens_per_s"] > 0 and "16x16" in wafer["mesh"]


def test_prefill_json_reports_the_first_tokens_and_equals_the_reference(ray_session, tiny_gguf, capsys):
    argv = ["generate", "hello world, once upon a time", "abc", "--model", tiny_gguf, "--max-new-tokens", "5",
            "--json"]
    assert main(argv + WAFER + ["--prefill"]) == 0  # prefilled by MeshGEMM
    got = capsys.readouterr()
    wafer = json.loads(got.out)
    assert "prompts prefilled by MeshGEMM" in got.err
    assert wafer["tokens"] == _json(capsys, argv + ["--reference"])["tokens"]
    for key in ("ttft_wall_s", "ttft_modelled_s", "prefill_tokens_per_s"):
        assert len(wafer[key]) == 2 and all(v > 0 for v in wafer[key]), key
    prompt = len(wafer["prompt_tokens"][0])
    assert wafer["prefill_tokens_per_s"][0] == pytest.approx(prompt / wafer["ttft_modelled_s"][0])


def test_one_prompt_streams_its_text(ray_session, tiny_gguf, capsys):
    assert main(["generate", "hello", "--model", tiny_gguf, "--max-new-tokens", "6"] + WAFER) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hello") and "tok/s" in err and "modelled wafer" in err


def test_several_prompts_print_each_request_when_it_completes(ray_session, tiny_gguf, capsys):
    assert main(["generate", "hello", "to be", "--model", tiny_gguf, "--max-new-tokens", "5"] + WAFER) == 0
    out = capsys.readouterr().out
    assert out.count("--- request ") == 2 and "\nhello" in out and "\nto be" in out


def test_trace_heatmap_and_verbose(ray_session, tiny_gguf, capsys, tmp_path):
    trace, png = tmp_path / "trace.json", tmp_path / "mesh.png"
    argv = ["generate", "hello", "abc", "--model", tiny_gguf, "--max-new-tokens", "4", "--trace", str(trace),
            "--heatmap", str(png), "-v"]
    assert main(argv + WAFER) == 0
    err = capsys.readouterr().err
    assert f"trace: {trace}" in err and f"heatmap: {png}" in err
    assert err.count(": token ") == 8  # -v: a line per token (stderr is not a terminal here: no bars)
    tracks = check_trace(json.loads(trace.read_text()))
    assert {t for p, t in tracks if p.startswith("wafer")} == {"host", "tile(0,0)", "tile(1,0)", "tile(0,1)",
                                                              "tile(1,1)"}
    assert check_handovers(json.loads(trace.read_text()))  # the arrows: every hand-over between tiles
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_sparse_on_the_wafer_equals_the_references_sparse_mode(ray_session, tiny_gguf, capsys):
    argv = ["generate", "hello world, once upon a time", "--model", tiny_gguf, "--max-new-tokens", "10",
            "--attention", "sparse:4", "--json"]  # 4 keys of a ~30-position context: the sparse path runs
    wafer = _json(capsys, argv + WAFER)
    ref = _json(capsys, argv + ["--reference"])
    dense = _json(capsys, argv[:-3] + ["--json", "--reference"])
    assert wafer["tokens"] == ref["tokens"] and len(ref["tokens"]) == 10
    assert ref["tokens"] != dense["tokens"]  # 4 keys change what the reference says, so the match means something
