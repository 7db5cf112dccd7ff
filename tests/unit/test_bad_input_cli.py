"""Every bad command line is one clear line on stderr (besides "[waferrt 0.3s] ..." progress lines), exit status
2, no traceback, and fast: it is caught before the weights are loaded or Ray starts (each case runs
``python -m waferrt.cli`` in a subprocess).

The time bound is generous (the machine is shared and loaded); what it separates is "refused while parsing"
(about a second) from "refused after the model loaded or Ray started" (tens of seconds here).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
from ggufs import write_gguf
from loopback import answering

from waferrt.faults import FaultPlan, NodeLoss
from waferrt.model import synthetic_llama, tiny_config

BOUND_S = 10.0
TINY_WAFER = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Model files, good and broken, and prompt files: name -> path."""
    d = tmp_path_factory.mktemp("bad-input")
    config = dataclasses.replace(tiny_config(), vocab_size=264)
    good = d / "tiny.gguf"
    write_gguf(good, config, synthetic_llama(config, seed=4), merges=("Ġ t",), extra_tokens=("Ġt",))
    data = good.read_bytes()
    out = {"tiny": good, "cut": d / "cut.gguf", "four": d / "four.gguf", "bare": d / "bare.gguf",
           "header_cut": d / "header_cut.gguf", "text": d / "notes.gguf", "binary": d / "prompts.bin",
           "blank": d / "blank.txt", "dir": d}
    out["cut"].write_bytes(data[: len(data) * 2 // 3])
    out["four"].write_bytes(b"GGUF")
    out["bare"].write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # version 3, 0 tensors, 0 keys
    out["header_cut"].write_bytes(data[:200])
    out["text"].write_text("just some notes\n")
    out["binary"].write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    out["blank"].write_text("\n   \n\n")
    out["nodeplan"] = d / "nodes.json"
    FaultPlan((NodeLoss(2),)).save(out["nodeplan"])  # loses node 2: needs three nodes
    out["badplan"] = d / "bad.json"
    out["badplan"].write_text('{"faults": [{"kind": "meteor"}]}')
    return {k: str(v) for k, v in out.items()} | {"tiny_size": str(len(data)), "cut_size": str(len(data) * 2 // 3)}


@pytest.fixture(scope="module")
def not_ray():
    """A loopback port that answers like a web server, not like Ray's gRPC GCS."""
    with answering(b"HTTP/1.1 400 Bad Request\r\n\r\n") as address:
        yield address


LONG_PROMPT = "to be or not to be " * 6  # 103 tokens of the tiny vocabulary (bytes and "Ġt")

# (id, argv with {placeholders} for files, words the one line must contain)
CASES = [
    ("empty prompt", ["generate", ""], "a prompt is empty"),
    ("moe not E,K", ["convert", "--moe", "8", "{dir}/moe.gguf"], "'8' is not E,K"),
    ("moe K above E", ["convert", "--moe", "2,3", "{dir}/moe.gguf"], "K must be 1..E"),
    ("moe into a missing folder", ["convert", "--moe", "8,2", "/nonexistent/moe.gguf"], "does not exist"),
    ("moe cut unequal", ["convert", "--moe", "5,2", "--model", "{tiny}", "{dir}/moe.gguf"], "do not cut into 5"),
    ("moe and shape at once", ["convert", "--moe", "8,2", "--shape", "llama3-8b", "{dir}/m.gguf"], "give one of them"),
    ("a cut's flag with moe", ["convert", "--moe", "8,2", "--layers", "2", "{dir}/m.gguf"],
     "--layers belongs to --shape"),
    ("moe's flag with a cut", ["convert", "--shape", "llama3-8b", "--layers", "2", "--router", "zero", "{dir}/m.gguf"],
     "--router belongs to --moe"),
    ("no prompt", ["generate"], "give at least one prompt"),
    ("negative seed", ["generate", "x", "--seed", "-1", "--temperature", "0.5"], "--seed: -1 is less than 0"),
    ("negative temperature", ["generate", "x", "--temperature", "-1"], "--temperature: -1 is negative"),
    ("nan temperature", ["generate", "x", "--temperature", "nan"], "--temperature: nan is not a finite number"),
    ("inf temperature", ["generate", "x", "--temperature", "inf"], "inf is not a finite number"),
    ("word temperature", ["generate", "x", "--temperature", "hot"], "'hot' is not a number"),
    ("top-p 0", ["generate", "x", "--top-p", "0"], "--top-p: 0 is outside (0, 1]"),
    ("top-p 1.5", ["generate", "x", "--top-p", "1.5"], "--top-p: 1.5 is outside (0, 1]"),
    ("negative top-k", ["generate", "x", "--top-k", "-1"], "--top-k: -1 is less than 0"),
    ("zero new tokens", ["generate", "x", "--max-new-tokens", "0"], "--max-new-tokens: 0 is less than 1"),
    ("zero kv tokens", ["generate", "x", "--kv-tokens", "0"], "--kv-tokens: 0 is less than 1"),
    ("negative requests", ["generate", "x", "--requests", "-3"], "--requests: -3 is less than 1"),
    ("float requests", ["generate", "x", "--requests", "2.5"], "'2.5' is not a whole number"),
    ("zero max tiles", ["generate", "x", "--max-tiles", "0"], "--max-tiles: 0 is less than 1"),
    ("binary prompt file", ["generate", "--file", "{binary}"], "is not a text file (it holds binary data)"),
    ("missing prompt file", ["generate", "--file", "/nonexistent/prompts.txt"], "cannot read"),
    ("blank prompt file", ["generate", "--file", "{blank}"], "give at least one prompt"),
    ("4-byte GGUF", ["generate", "x", "--model", "{four}"],
     "the file is truncated inside its header (expected at least 24 bytes, got 4)"),
    ("bare GGUF header", ["generate", "x", "--model", "{bare}"], "lacks the metadata key 'general.architecture'"),
    ("truncated GGUF", ["generate", "x", "--model", "{cut}"],
     "the file is truncated (expected {tiny_size:,} bytes, got {cut_size:,})"),
    ("GGUF cut in its header", ["generate", "x", "--model", "{header_cut}"], "the file is truncated inside its header"),
    ("not a GGUF", ["generate", "x", "--model", "{text}"], "is not a GGUF file: it starts with b'just'"),
    ("missing model", ["generate", "x", "--model", "/nonexistent/m.gguf"], "'/nonexistent/m.gguf' does not exist"),
    ("model is a directory", ["generate", "x", "--model", "{dir}"], "is a directory"),
    ("mesh beyond the wafer", ["generate", "x", "--mesh", "100000x100000"],
     "a 100000x100000 mesh does not fit on the wse2 wafer, which has 750x994 cores"),
    ("too many tile actors", ["generate", "x", "--mesh", "174x128", "--tile", "1x1"],
     "is 22,272 tile actors, each a Ray worker process"),
    ("tile without mesh", ["generate", "x", "--tile", "8x8"], "--tile needs --mesh"),
    ("tile larger than mesh", ["generate", "x", "--mesh", "4x4", "--tile", "8x8"], "tile 8x8 is larger than the mesh"),
    ("mesh not WxH", ["generate", "x", "--mesh", "8by8"], "'8by8' is not WIDTHxHEIGHT"),
    ("generate dtype", ["generate", "x", "--dtype", "int8"], "invalid choice: 'int8'"),
    ("unknown spec", ["generate", "x", "--spec", "wse9"], "invalid choice: 'wse9'"),
    ("nobody at the address", ["generate", "x", "--address", "127.0.0.1:1"],
     "no Ray cluster at Ray address '127.0.0.1:1'"),
    ("address not host:port", ["generate", "x", "--address", "headnode"], "is not HOST:PORT"),
    ("address is not Ray", ["generate", "x", "--address", "{not_ray}"], "but it is not a Ray cluster"),
    ("prompt beyond the K/V", ["generate", LONG_PROMPT, "--model", "{tiny}", "--kv-tokens", "8", "--requests", "1",
                               *TINY_WAFER], "has a prompt of 103 tokens but a request slot holds 60 KV positions"),
    ("new tokens beyond the K/V", ["generate", "hi", "--model", "{tiny}", "--kv-tokens", "8", "--requests", "1",
                                   "--max-new-tokens", "100", *TINY_WAFER], "lower max_new_tokens to 58"),
    ("model does not fit", ["generate", "x", "--model", "{tiny}", "--spec", "tiny", "--mesh", "4x4"],
     "does not fit on the mesh 4x4"),
    ("unknown flag", ["generate", "x", "--temprature", "1"], "unrecognized arguments: --temprature"),
    ("png in a missing folder", ["plan", "--png", "/nonexistent/dir/p.png"],
     "the directory '/nonexistent/dir' does not exist: create it first"),
    ("png is a folder", ["plan", "--png", "{dir}"], "is a directory; give a file name"),
    ("plan dtype foo", ["plan", "--dtype", "foo"], "invalid choice: 'foo'"),
    ("plan dtype int8", ["plan", "--dtype", "int8"], "invalid choice: 'int8'"),
    ("plan mesh beyond the wafer", ["plan", "--mesh", "1000000x1000000"], "does not fit on the wse2 wafer"),
    ("plan negative nodes", ["plan", "--nodes", "-2"], "--nodes: -2 is less than 1"),
    ("plan zero cpus", ["plan", "--cpus", "0"], "--cpus: 0 is less than 1"),
    ("plan negative dead", ["plan", "--dead", "-5"], "--dead: -5 is less than 0"),
    ("plan negative seed", ["plan", "--seed", "-1"], "--seed: -1 is less than 0"),
    ("plan strategy of the old words", ["plan", "--strategy", "pipeline"],
     "'pipeline' is not a strategy: write layer, tensor, grouped or grouped:N"),
    ("plan group beyond the layers", ["plan", "--strategy", "grouped:31", "--mesh", "174x128"],
     "use layer, tensor, grouped or grouped:N with N from 1 to 30"),
    ("estimate strategy of the old words", ["estimate", "--strategy", "pipeline"],
     "'pipeline' is not a strategy: write layer, tensor, grouped or grouped:N"),
    ("estimate group beyond the layers", ["estimate", "--model", "smollm2-135m", "--strategy", "grouped:31"],
     "use layer, tensor, grouped or grouped:N with N from 1 to 30"),
    ("estimate --group is gone", ["estimate", "--group", "4"], "unrecognized arguments: --group"),
    ("sweep strategy of the old words", ["sweep", "--strategy", "mixed"],
     "'mixed' is not a strategy: write layer, tensor, grouped or grouped:N"),
    ("plan objective foo", ["plan", "--objective", "fast"], "invalid choice: 'fast'"),
    ("plan 1x1 tiles", ["plan", "--mesh", "174x128", "--tile", "1x1"],
     "use larger tiles, e.g. 11x8 cores (256 tiles), or raise the limit to 22272"),
    ("plan truncated GGUF", ["plan", "--model", "{cut}"], "cannot read --model: "),
    ("demo mesh beyond the wafer", ["demo", "--mesh", "100x100"], "does not fit on the tiny wafer"),
    ("demo too many tiles", ["demo", "--mesh", "64x64", "--tile", "1x1"], "4,096 tile actors"),
    ("demo nobody at the address", ["demo", "--address", "127.0.0.1:1"], "no Ray cluster at"),
    ("chaos node loss on one node", ["chaos", "--model", "tiny", "--kinds", "node", "--nodes", "1"],
     "--kinds node: a node loss needs several Ray nodes"),
    ("chaos too many nodes", ["chaos", "--nodes", "9"], "--nodes: 9 Ray nodes on one machine is too many: at most 8"),
    ("chaos unknown kind", ["chaos", "--kinds", "core,meteor"],
     "fault kinds are a comma-separated list of core,link,corrupt,straggler,tile,node"),
    ("chaos plan losing a node not started", ["chaos", "--model", "tiny", "--plan", "{nodeplan}", "--nodes", "2"],
     "loses Ray node 2, but --nodes 2 starts nodes 0..1 (0 runs this driver): give --nodes 3 or more"),
    ("chaos plan not a plan", ["chaos", "--model", "tiny", "--plan", "{badplan}"], "--plan "),
    ("chaos too many requests", ["chaos", "--model", "tiny", "--requests", "9"], "--requests 9: at most 8"),
    ("chaos tile without mesh", ["chaos", "--model", "tiny", "--tile", "8x8"], "--tile needs --mesh"),
    ("chaos strategy of the old words", ["chaos", "--strategy", "pipeline"], "'pipeline' is not a strategy"),
    ("unknown command", ["bogus"], "invalid choice: 'bogus'"),
]


@pytest.mark.parametrize("argv, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_command_line_is_one_clear_line(argv, words, files, not_ray):
    values = {**files, "tiny_size": int(files["tiny_size"]), "cut_size": int(files["cut_size"]),
              "not_ray": not_ray}
    argv = [a.format(**values) for a in argv]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", *argv], capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("[waferrt ")]  # not progress
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    assert words.format(**values) in lines[0]
    assert lines[0].startswith("waferrt"), lines[0]
    assert proc.stdout == ""
    assert wall < BOUND_S, f"took {wall:.1f}s: was it checked only after the model loaded or Ray started?"
