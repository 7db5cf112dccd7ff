"""Every bad command line of ``waferrt generate`` (and an unknown command) is one clear line on stderr, exit
status 2, no traceback, and fast: it is caught before the weights are loaded or Ray starts (tests/badcli.py runs
the cases; the other commands' are test_bad_input_plan.py, _paper.py and _train.py). Two cases also run as their
own ``python -m waferrt.cli`` to check the real entry point, and Ray without token authentication is refused.
"""

from __future__ import annotations

import os

import pytest
from badcli import LONG_PROMPT, TINY_WAFER, one_line, suite

# (id, argv with {placeholders} for files, words the one line must contain)
CASES = [
    ("unknown command", ["bogus"], "invalid choice: 'bogus'"),
    ("empty prompt", ["generate", ""], "a prompt is empty"),
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
    ("wafer past the context", ["generate", LONG_PROMPT, "--model", "{tiny}", *TINY_WAFER, "--max-new-tokens", "40"],
     "prompt 0 is 103 tokens and --max-new-tokens 40 asks for 143 positions, more than the model's context of 128: "
     "give --max-new-tokens 25 or less"),
    ("reference past the context", ["generate", LONG_PROMPT, "--model", "{tiny}", "--reference",
                                    "--max-new-tokens", "40"], "more than the model's context of 128"),
    ("prefill K/V past the context", ["generate", "x", "--model", "{tiny}", *TINY_WAFER, "--prefill", "--kv-tokens",
                                      "200"], "--kv-tokens 200 is more than the model's context of 128 positions"),
    ("prompt beyond the K/V", ["generate", LONG_PROMPT, "--model", "{tiny}", "--kv-tokens", "8", "--requests", "1",
                               "--max-new-tokens", "8", *TINY_WAFER],
     "has a prompt of 103 tokens but a request slot holds 60 KV positions"),
    ("new tokens beyond the K/V", ["generate", "hi", "--model", "{tiny}", "--kv-tokens", "8", "--requests", "1",
                                   "--max-new-tokens", "100", *TINY_WAFER], "lower max_new_tokens to 58"),
    ("sparse beyond the K/V", ["generate", LONG_PROMPT, "--model", "{tiny}", "--attention", "sparse:16",
                               "--kv-tokens", "8", "--max-new-tokens", "8"],
     "a request needs 111 K/V positions (its prompt and --max-new-tokens 8) but --kv-tokens is 8: write "
     "--kv-tokens 111 --requests 1"),
    ("attention word", ["generate", "x", "--attention", "sparse"], "write dense, sparse:K (keys per head"),
    ("attention keeps no key", ["generate", "x", "--attention", "sparse:0"], "sparse:0 keeps no key"),
    ("attention fraction", ["generate", "x", "--attention", "sparse:1.5"], "sparse:1.5 is not a fraction in (0, 1)"),
    ("model does not fit", ["generate", "x", "--model", "{tiny}", "--spec", "tiny", "--mesh", "4x4"],
     "does not fit on the mesh 4x4"),
    ("unknown flag", ["generate", "x", "--temprature", "1"], "unrecognized arguments: --temprature"),
    ("generate prompt file is a directory", ["generate", "--file", "{dir}"], "cannot read"),
    ("generate prompt file is a device", ["generate", "--file", "/dev/zero"],
     "cannot read '/dev/zero': it is not a regular file"),
    ("generate huge prompt file", ["generate", "--file", "{huge}"], "holds more than 16 MB: give a file of prompts"),
    ("generate model is a device", ["generate", "x", "--model", "/dev/zero"], "'/dev/zero' is not a regular file"),
    ("generate huge kv tokens", ["generate", "x", "--kv-tokens", "1" + "0" * 30], "is more than 16,777,216"),
    ("generate trace in a missing folder", ["generate", "x", "--trace", "/nonexistent/t.json"],
     "--trace: the directory '/nonexistent' does not exist"),
    ("generate trace unwritable", ["generate", "x", "--trace", "/proc/t.json"], "cannot write '/proc/t.json'"),
    ("generate trace onto a FIFO", ["generate", "x", "--trace", "{fifo}"],
     "--trace: cannot write '{fifo}': it is not a"),
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
    ("generate prefill streaming", ["generate", "x", "--prefill", "--streaming"],
     "--prefill and --streaming do not go together: weight streaming has no MeshGEMM prefill"),
    ("generate reference prefill", ["generate", "x", "--reference", "--prefill"],
     "--reference and --prefill do not go together"),
    # -- the MoE and attention flags against the model and each other --
    ("generate balance on the reference", ["generate", "x", "--reference", "--balance", "4", "--model", "{moe}"],
     "--reference and --balance do not go together"),
    ("generate experts on the reference", ["generate", "x", "--reference", "--experts", "naive", "--model", "{moe}"],
     "--reference and --experts do not go together"),
    ("generate balance of a dense model", ["generate", "x", "--balance", "4", "--model", "{tiny}"],
     "--balance places the experts of a mixture of experts, but --model {tiny} is dense: leave --balance out"),
    ("generate experts of a dense model", ["generate", "x", "--experts", "er", "--model", "{tiny}"],
     "--experts places the experts of a mixture of experts"),
    ("generate prefill of an MoE", ["generate", "x", "--prefill", "--model", "{moe}"],
     "--prefill is not for a mixture of experts yet (--model {moe}: 4 experts, top 2): leave out --prefill"),
    ("generate streaming of an MoE", ["generate", "x", "--streaming", "--model", "{moe}"],
     "--streaming is not for a mixture of experts yet"),
    ("generate negative balance", ["generate", "x", "--balance", "-1"], "--balance: -1 is less than 0"),
    ("generate unknown mapping", ["generate", "x", "--experts", "random"], "invalid choice: 'random'"),
    ("generate compare-dense on the reference", ["generate", "x", "--compare-dense", "--reference"],
     "--compare-dense compares the wafer's tokens with the dense reference's"),
    ("generate attention nan", ["generate", "x", "--attention", "sparse:nan"], "write dense, sparse:K"),
]


results, test_a_bad_command_line_is_one_clear_line = suite(CASES)


@pytest.mark.parametrize("argv, words", [
    (["sweep", "--png", "/nonexistent/dir/s.png"], "the directory '/nonexistent/dir' does not exist"),
    (["estimate", "--kv-tokens", "0"], "--kv-tokens: 0 is less than 1")])
def test_the_real_entry_point_says_the_same(argv, words):
    """`python -m waferrt.cli` itself: exit status 2, the one line, no traceback, before anything loads."""
    one_line(argv, words, os.environ)


def test_a_bad_keep_tiles_setting_is_refused_before_ray_starts():
    """WAFERRT_KEEP_TILES (waferrt.actors.pool) that is not a whole number >= 0: the one line says what to write."""
    one_line(["demo"], "WAFERRT_KEEP_TILES='many': give the most idle tile actors to keep for the next Wafer, a whole "
             "number >= 0 (e.g. WAFERRT_KEEP_TILES=8)", {**os.environ, "WAFERRT_KEEP_TILES": "many"})


@pytest.mark.parametrize("mode", ["disabled"])
def test_ray_without_token_authentication_is_refused_before_it_starts(mode):
    """RAY_AUTH_MODE other than token would leave Ray's ports open to anyone on the network: refused."""
    one_line(["demo"], f"RAY_AUTH_MODE={mode} turns off Ray's token authentication", {**os.environ,
                                                                                     "RAY_AUTH_MODE": mode})
