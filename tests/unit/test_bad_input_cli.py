"""Every bad command line is one clear line on stderr (besides "[waferrt 0.3s] ..." progress lines), exit status
2, no traceback, and fast: it is caught before the weights are loaded or Ray starts.

The cases of one command run in one subprocess (RUNNER: ``waferrt.cli.main`` on each argv in turn, as
``python -m waferrt.cli`` would, stderr and stdout captured, SystemExit taken as the exit status, any other
exception as a traceback), so that the file takes seconds, not a minute of interpreter starts; one case also
runs as its own ``python -m waferrt.cli`` to check the real entry point. The time bound is generous (the
machine is shared and loaded); what it separates is "refused while parsing" (well under a second once the
modules are imported) from "refused after the model loaded or Ray started" (tens of seconds here).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
from ggufs import Vocab, write_gguf
from loopback import answering

from waferrt.faults import FaultPlan, NodeLoss
from waferrt.model import synthetic_llama, tiny_config, tiny_moe_config

BOUND_S = 10.0
TINY_WAFER = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Model files, good and broken, and prompt files: name -> path."""
    d = tmp_path_factory.mktemp("bad-input")
    config = dataclasses.replace(tiny_config(), vocab_size=264)
    good = d / "tiny.gguf"
    write_gguf(good, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
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
    plans = {"broken_yaml": ("plan.yaml", "faults:\n  - kind: core\n    core: [1, 2\n"),
             "broken_json": ("plan.json", '{"faults": ['),
             "list_plan": ("list.json", "[1, 2]"),
             "text_plan": ("text.yaml", "just some words\n"),
             "off_core": ("off_core.json", '{"faults": [{"kind": "core", "core": [99, 99]}]}'),
             "off_link": ("off_link.yaml", "faults:\n- kind: link\n  a: [100, 0]\n  b: [101, 0]\n"),
             "off_tile": ("off_tile.json", '{"faults": [{"kind": "tile", "tile": [5, 5]}]}')}
    for key, (name, text) in plans.items():
        out[key] = d / name
        out[key].write_text(text)
    out["huge"] = d / "huge.txt"
    out["huge"].write_bytes(b"a prompt\n" * (2 << 20))  # 18 MB
    moe = dataclasses.replace(tiny_moe_config(), vocab_size=264)
    out["moe"] = d / "moe.gguf"
    write_gguf(out["moe"], moe, synthetic_llama(moe, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    out["plandir"] = d / "plans.json"  # a directory where a file is expected
    out["plandir"].mkdir()
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
    ("sparse beyond the K/V", ["generate", LONG_PROMPT, "--model", "{tiny}", "--attention", "sparse:16",
                               "--kv-tokens", "8"],
     "a request needs 167 K/V positions (its prompt and --max-new-tokens 64) but --kv-tokens is 8: write "
     "--kv-tokens 167 --requests 1"),
    ("attention word", ["generate", "x", "--attention", "sparse"], "write dense, sparse:K (keys per head"),
    ("attention keeps no key", ["generate", "x", "--attention", "sparse:0"], "sparse:0 keeps no key"),
    ("attention fraction", ["generate", "x", "--attention", "sparse:1.5"], "sparse:1.5 is not a fraction in (0, 1)"),
    ("sparse on the reference", ["generate", "x", "--reference", "--attention", "sparse:8"],
     "the numpy reference (--reference) decodes densely"),
    ("estimate attention word", ["estimate", "--attention", "topk"], "write dense, sparse:K"),
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
    # -- what a hostile first week found (issue 18) and its kin --
    ("chaos plan of broken YAML", ["chaos", "--model", "tiny", "--plan", "{broken_yaml}"],
     "not valid YAML at line 4, column 1"),
    ("chaos plan of broken JSON", ["chaos", "--model", "tiny", "--plan", "{broken_json}"],
     "not valid JSON at line 1, column 13"),
    ("chaos plan of a list", ["chaos", "--model", "tiny", "--plan", "{list_plan}"],
     "not a fault plan (it holds list '[1, 2]'): write a mapping with 'faults'"),
    ("chaos plan of plain text", ["chaos", "--model", "tiny", "--plan", "{text_plan}"],
     "not a fault plan (it holds str"),
    ("chaos plan core off the mesh", ["chaos", "--model", "tiny", "--plan", "{off_core}"],
     "fault 0 (core) core (x=99, y=99) is not on the 16x16 mesh (cores (x=0, y=0)..(x=15, y=15))"),
    ("chaos plan link off the mesh", ["chaos", "--model", "tiny", "--plan", "{off_link}"],
     "fault 0 (link) link (x=100, y=0)-(x=101, y=0): core (x=100, y=0) is not on the 16x16 mesh"),
    ("chaos plan tile off the mesh", ["chaos", "--model", "tiny", "--plan", "{off_tile}"],
     "tile(5,5) is not a tile of the mesh 16x16 cores"),
    ("chaos plan missing", ["chaos", "--model", "tiny", "--plan", "/nonexistent/p.json"],
     "cannot read it: No such file or directory"),
    ("chaos plan is a directory", ["chaos", "--model", "tiny", "--plan", "{plandir}"], "it is a directory"),
    ("chaos save-plan in a missing folder", ["chaos", "--save-plan", "/nonexistent/p.yaml"],
     "--save-plan: the directory '/nonexistent' does not exist"),
    ("chaos save-plan is a folder", ["chaos", "--save-plan", "{plandir}"], "is a directory; give a file name"),
    ("chaos huge faults", ["chaos", "--faults", "100000000"], "--faults: 100,000,000 is more than 1,000"),
    ("chaos plan and kinds", ["chaos", "--model", "tiny", "--plan", "{nodeplan}", "--kinds", "core"],
     "--plan and --kinds do not go together: the --plan file says which faults strike where and when"),
    ("chaos plan and seed", ["chaos", "--model", "tiny", "--plan", "{nodeplan}", "--seed", "3"],
     "--plan and --seed do not go together"),
    ("chaos zero faults", ["chaos", "--faults", "0"], "--faults: 0 is less than 1"),
    ("chaos zero new tokens", ["chaos", "--max-new-tokens", "0"], "--max-new-tokens: 0 is less than 1"),
    ("chaos negative seed", ["chaos", "--seed", "-2"], "--seed: -2 is less than 0"),
    ("chaos unknown model", ["chaos", "--model", "gpt5"], "'gpt5' does not exist: give 'smollm2'"),
    ("chaos unknown policy", ["chaos", "--policy", "brave"], "invalid choice: 'brave'"),
    ("sweep png in a missing folder", ["sweep", "--png", "/nonexistent/s.png"],
     "--png: the directory '/nonexistent' does not exist: create it first"),
    ("sweep png is a folder", ["sweep", "--png", "{dir}"], "is a directory; give a file name"),
    ("sweep png under a file", ["sweep", "--png", "{text}/s.png"], "is a file, not a directory"),
    ("sweep png not a picture", ["sweep", "--png", "{dir}/s.json"], "is not a picture's name: end it in .png"),
    ("sweep png unwritable", ["sweep", "--png", "/proc/s.png"], "cannot write '/proc/s.png'"),
    ("sweep zero kv tokens", ["sweep", "--kv-tokens", "0"], "--kv-tokens: 0 is less than 1"),
    ("sweep zero requests", ["sweep", "--requests", "0"], "--requests: 0 is less than 1"),
    ("sweep zero sram", ["sweep", "--sram", "0"], "--sram: '0': every value is KB of SRAM per core"),
    ("sweep huge sram", ["sweep", "--sram", "48,1e30"], "a number in (0, 1024]"),
    ("sweep infinite clock", ["sweep", "--clock", "inf"], "--clock: 'inf': every value is GHz"),
    ("sweep nan link", ["sweep", "--link", "nan"], "--link: 'nan': every value is bytes per cycle"),
    ("sweep words for sram", ["sweep", "--sram", "lots"], "'lots' is not a comma-separated list of numbers"),
    ("sweep zero mesh", ["sweep", "--mesh", "650x862,0x5"], "'0x5': width and height must be at least 1"),
    ("sweep unknown model", ["sweep", "--model", "gpt5"], "--model 'gpt5' is neither a named model"),
    ("estimate zero kv tokens", ["estimate", "--kv-tokens", "0"], "--kv-tokens: 0 is less than 1"),
    ("estimate negative kv tokens", ["estimate", "--kv-tokens", "-5"], "--kv-tokens: -5 is less than 1"),
    ("estimate kv beyond the context", ["estimate", "--kv-tokens", "100000"],
     "--kv-tokens 100,000 is more than Llama3-8B's context of 8,192 positions"),
    ("estimate zero requests", ["estimate", "--requests", "0"], "--requests: 0 is less than 1"),
    ("estimate float requests", ["estimate", "--requests", "1.5"], "'1.5' is not a whole number"),
    ("estimate unknown model", ["estimate", "--model", "gpt5"], "--model 'gpt5' is neither a named model"),
    ("estimate model is a directory", ["estimate", "--model", "{dir}"], "is neither a named model"),
    ("estimate model not a GGUF", ["estimate", "--model", "{text}"], "is not a GGUF file"),
    ("estimate mesh beyond the wafer", ["estimate", "--mesh", "100000x100000"], "is not inside the wse2 wafer"),
    ("estimate unknown preset", ["estimate", "--preset", "wse9"], "invalid choice: 'wse9'"),
    ("estimate seq without train", ["estimate", "--seq", "512"], "--seq is an option of `waferrt estimate --train`"),
    ("estimate train with kv tokens", ["estimate", "--train", "--kv-tokens", "5"],
     "--train and --kv-tokens do not go together"),
    ("estimate train seq beyond the context", ["estimate", "--train", "--seq", "100000"],
     "--seq 100,000 is more than the model's context of 8,192 positions"),
    ("estimate train zero batch", ["estimate", "--train", "--global-batch", "0"], "--global-batch: 0 is less than 1"),
    ("estimate train unknown template", ["estimate", "--train", "--template", "wse9"], "invalid choice: 'wse9'"),
    ("estimate train unknown topology", ["estimate", "--train", "--topology", "ring"], "invalid choice: 'ring'"),
    ("estimate memory objective without train", ["estimate", "--objective", "memory"],
     "--objective memory is for --train"),
    ("sweep dies without train", ["sweep", "--dies", "2x2"], "--dies is an option of `waferrt sweep --train`"),
    ("sweep train with a mesh", ["sweep", "--train", "--mesh", "10x10"], "--train and --mesh do not go together"),
    ("sweep train with a clock", ["sweep", "--train", "--clock", "1"], "--train and --clock do not go together"),
    ("sweep train unknown topology", ["sweep", "--train", "--topology", "mesh,ring"], "'ring' is not a topology"),
    ("sweep train zero d2d", ["sweep", "--train", "--d2d", "0"], "--d2d: '0': every value is TB/s per die edge"),
    ("sweep train zero dies", ["sweep", "--train", "--dies", "0x2"], "'0x2': width and height must be at least 1"),
    ("plan huge nodes", ["plan", "--nodes", "100000"], "--nodes: 100,000 is more than 1,024"),
    ("plan heatmap in a missing folder", ["plan", "--heatmap", "/nonexistent/h.png"],
     "--heatmap: the directory '/nonexistent' does not exist"),
    ("plan heatmap not a picture", ["plan", "--heatmap", "{dir}/h.txt"], "is not a picture's name"),
    ("plan png unwritable", ["plan", "--png", "/proc/p.png"], "cannot write '/proc/p.png'"),
    ("plan dead beyond the mesh", ["plan", "--dead", "1000000", "--mesh", "174x128"],
     "--dead 1000000 is more than the 22272 live cores"),
    ("plan zero kv tokens", ["plan", "--kv-tokens", "0"], "--kv-tokens: 0 is less than 1"),
    ("plan missing model", ["plan", "--model", "/nonexistent/m.gguf"], "does not exist"),
    ("demo zero mesh", ["demo", "--mesh", "0x4"], "'0x4': width and height must be at least 1"),
    ("demo unknown algo", ["demo", "--algo", "magic"], "invalid choice: 'magic'"),
    ("demo negative max tiles", ["demo", "--max-tiles", "-1"], "--max-tiles: -1 is less than 1"),
    ("generate prompt file is a directory", ["generate", "--file", "{dir}"], "cannot read"),
    ("generate prompt file is a device", ["generate", "--file", "/dev/zero"],
     "cannot read '/dev/zero': it is not a regular file"),
    ("generate huge prompt file", ["generate", "--file", "{huge}"], "holds more than 16 MB: give a file of prompts"),
    ("generate model is a device", ["generate", "x", "--model", "/dev/zero"], "'/dev/zero' is not a regular file"),
    ("chaos tiles the decode cannot use", ["chaos", "--model", "tiny", "--mesh", "16x16", "--tile", "3x3"],
     "spans 2 tiles of 3x3 cores; the decode runs every region inside one tile"),
    ("generate huge kv tokens", ["generate", "x", "--kv-tokens", "1" + "0" * 30], "is more than 16,777,216"),
    ("plan huge kv tokens", ["plan", "--kv-tokens", "1" + "0" * 30], "is more than 16,777,216"),
    ("plan huge max tiles", ["plan", "--max-tiles", "1" + "0" * 30], "is more than 16,777,216"),
    ("estimate huge requests", ["estimate", "--requests", "1" + "0" * 30], "is more than 65,536"),
    ("chaos plan is a device", ["chaos", "--model", "tiny", "--plan", "/dev/zero"], "it is not a regular file"),
    ("generate trace in a missing folder", ["generate", "x", "--trace", "/nonexistent/t.json"],
     "--trace: the directory '/nonexistent' does not exist"),
    ("generate trace unwritable", ["generate", "x", "--trace", "/proc/t.json"], "cannot write '/proc/t.json'"),
    ("generate heatmap is a folder", ["generate", "x", "--heatmap", "{dir}"], "is a directory; give a file name"),
    ("generate system without chat", ["generate", "x", "--system", "be brief"],
     "--system is the system prompt of --chat"),
    ("generate reference on a mesh", ["generate", "x", "--reference", "--mesh", "8x8"],
     "--reference and --mesh do not go together"),
    ("generate reference streaming", ["generate", "x", "--reference", "--streaming"],
     "--reference and --streaming do not go together"),
    ("generate reference strategy", ["generate", "x", "--reference", "--strategy", "tensor"],
     "--reference and --strategy do not go together"),
    ("generate reference trace", ["generate", "x", "--reference", "--trace", "{dir}/t.json"],
     "--trace and --heatmap show the wafer"),
    ("generate greedy top-k", ["generate", "x", "--top-k", "5"], "--temperature 0 decodes greedily"),
    ("generate greedy top-p", ["generate", "x", "--top-p", "0.5"], "--temperature 0 decodes greedily"),
    ("generate streaming heatmap", ["generate", "x", "--streaming", "--heatmap", "{dir}/h.png"],
     "--heatmap draws weights held in SRAM"),
    ("train zero steps", ["train", "--steps", "0"], "--steps: 0 is less than 1"),
    ("train zero batch", ["train", "--batch", "0"], "--batch: 0 is less than 1"),
    ("train seq beyond the context", ["train", "--seq", "4000"],
     "--seq 4000 is longer than the model's context of 128 tokens"),
    ("train learning rate 2", ["train", "--lr", "2"], "--lr: 2 is outside (0, 1)"),
    ("train missing model", ["train", "--model", "/nonexistent/m.gguf"], "'/nonexistent/m.gguf' does not exist"),
    ("train truncated GGUF", ["train", "--model", "{cut}"], "the file is truncated"),
    ("train a mixture of experts", ["train", "--model", "{moe}"], "no backward for a mixture of experts"),
    ("train save in a missing folder", ["train", "--save", "/nonexistent/t.gguf"],
     "--save: the directory '/nonexistent' does not exist"),
    ("train resident beyond the SRAM", ["train", "--spec", "tiny", "--mesh", "2x2"],
     "511,744 bytes per core on 2x2, more than the 16,384 of a tiny core; add --streaming"),
    ("train mesh beyond the wafer", ["train", "--spec", "tiny", "--mesh", "100x100"],
     "larger than the tiny wafer's 64x64 cores"),
    ("train mesh backward splits RoPE", ["train", "--mesh", "16x16"],
     "ceil(16 / 16)) split a RoPE pair; give --mesh 15x15 or --on reference"),
    ("train mesh backward beyond the SRAM", ["train", "--steps", "1", "--batch", "8", "--seq", "128"],
     "core (x=0, y=0) (and every other) would hold"),
    ("train tile fault without streaming", ["train", "--fault", "tile:2"],
     "--fault tile:2:0: this run recovers from corrupt faults (tile: --streaming"),
    ("train core fault without spare squares", ["train", "--fault", "core:2"],
     "core: resident, --on mesh, a --mesh wider than tall, e.g. 16x8"),
    ("train core fault outside the square", ["train", "--mesh", "16x8", "--fault", "core:2:8,0"],
     "--fault core:2:8,0 strikes outside the run: give a step of 1..20, a layer of 0..2 and a core of 0..7,0..7"),
    ("train chaos beyond its steps", ["train", "--steps", "1", "--chaos", "4"],
     "--chaos 4: 4 faults over 1 steps: a step is redone at most 3 times; draw at most 3"),
    ("train fault of another kind", ["train", "--fault", "meteor:2"], "'meteor:2' is not a training fault"),
    ("train fault after the run", ["train", "--steps", "3", "--streaming", "--fault", "corrupt:5"],
     "--fault corrupt:5:0 strikes outside the run: give a step of 1..3"),
    ("generate prefill streaming", ["generate", "x", "--prefill", "--streaming"],
     "--prefill and --streaming do not go together: weight streaming has no MeshGEMM prefill"),
    ("generate reference prefill", ["generate", "x", "--reference", "--prefill"],
     "--reference and --prefill do not go together"),
]


# Runs each argv of a JSON list (stdin) through waferrt.cli.main in this one process; prints a JSON list of
# {status, stdout, stderr, wall} (status: main's return or SystemExit's code; "traceback" when it raised).
RUNNER = """
import contextlib, io, json, sys, time, traceback
from waferrt.cli import main

out = []
for argv in json.load(sys.stdin):
    err, std = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (print(e.code, file=sys.stderr) or 1)
        except BaseException:
            status = "traceback"
            traceback.print_exc()
    out.append({"status": status, "stdout": std.getvalue(), "stderr": err.getvalue(), "wall": time.monotonic() - t0})
print(json.dumps(out))
"""


def _values(files, not_ray) -> dict:
    return {**files, "tiny_size": int(files["tiny_size"]), "cut_size": int(files["cut_size"]), "not_ray": not_ray}


@pytest.fixture(scope="module")
def results(files, not_ray, tmp_path_factory) -> dict[str, dict]:
    """Case id -> what running it gave; the cases of each command in one subprocess, two at a time."""
    values = _values(files, not_ray)
    env = {**os.environ, "WAFERRT_CACHE": str(tmp_path_factory.mktemp("cache"))}
    by_command: dict[str, list] = {}
    for case_id, argv, _ in CASES:
        by_command.setdefault(argv[0], []).append((case_id, [a.format(**values) for a in argv]))
    procs = {cmd: subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env) for cmd in by_command}
    out = {}
    for cmd, proc in procs.items():
        stdout, stderr = proc.communicate(json.dumps([argv for _, argv in by_command[cmd]]), timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out.update(zip([case_id for case_id, _ in by_command[cmd]], json.loads(stdout), strict=True))
    return out


@pytest.mark.parametrize("case_id, words", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_command_line_is_one_clear_line(case_id, words, results, files, not_ray):
    got = results[case_id]
    lines = [line for line in got["stderr"].splitlines() if not line.startswith("[waferrt ")]  # not progress
    assert got["status"] == 2, got["stderr"][-2000:]
    assert "Traceback" not in got["stderr"] and len(lines) == 1, got["stderr"][-2000:]
    assert words.format(**_values(files, not_ray)) in lines[0]
    assert lines[0].startswith("waferrt"), lines[0]
    assert got["stdout"] == ""
    assert got["wall"] < BOUND_S, f"took {got['wall']:.1f}s: was it checked only after the model loaded or Ray started?"


@pytest.mark.parametrize("argv, words", [
    (["sweep", "--png", "/nonexistent/dir/s.png"], "the directory '/nonexistent/dir' does not exist"),
    (["estimate", "--kv-tokens", "0"], "--kv-tokens: 0 is less than 1")])
def test_the_real_entry_point_says_the_same(argv, words):
    """`python -m waferrt.cli` itself: exit status 2, the one line, no traceback, before anything loads."""
    _one_line(argv, words, os.environ)


@pytest.mark.parametrize("mode", ["disabled"])
def test_ray_without_token_authentication_is_refused_before_it_starts(mode):
    """RAY_AUTH_MODE other than token would leave Ray's ports open to anyone on the network: refused."""
    _one_line(["demo"], f"RAY_AUTH_MODE={mode} turns off Ray's token authentication", {**os.environ,
                                                                                      "RAY_AUTH_MODE": mode})


def _one_line(argv, words, env):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", *argv], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and words in proc.stderr and proc.stdout == ""
    assert time.monotonic() - t0 < BOUND_S
