"""Prefill benchmark: SmolLM2-135M prompts of 8 to 1024 tokens prefilled by MeshGEMM against the reference.

Contract: ``python benchmarks/prefill.py [--tokens 8 64 512 1024]`` (no Ray; minutes: the reference takes a
prompt token by token) decodes 3 greedy tokens after each prompt with the wafer decode in this process
(LocalDecoder with ``use_prefill()``: whole up to 512 tokens, in chunks of 512 beyond) and with the numpy
reference, one run side by side, and prints per prompt: the tokens identical or not, the modelled time to
first token and the prefill's modelled tokens/s, and the wall time of each side. Exits non-zero if any
request's tokens differ from the reference's.
"""

from __future__ import annotations

import argparse
import sys
import time

from waferrt.core.spec import WSE2
from waferrt.model import Sampler, Tokenizer, load_gguf
from waferrt.scheduler import KVReserve, default_mesh, plan
from waferrt.serving import GenRequest, LocalDecoder, generate_reference

TEXT = "The history of the wafer-scale engine begins with a simple question about memory. "


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8, 64, 512, 1024], help="prompt lengths")
    args = p.parse_args()
    config, weights, meta = load_gguf()
    ids = Tokenizer(meta).encode(TEXT * (1 + max(args.tokens) // 8))
    requests = [GenRequest(tuple(ids[:n]), 3) for n in args.tokens]
    kv = KVReserve(max(args.tokens) + 16, len(requests))
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    t0 = time.perf_counter()
    want, _ = generate_reference(config, weights, requests, Sampler())
    t1 = time.perf_counter()
    got, stats = LocalDecoder(config, weights, placement).use_prefill().generate(requests, Sampler())
    t2 = time.perf_counter()
    rates = stats.prefill_tokens_per_s(dict(enumerate(args.tokens)))
    print(f"SmolLM2-135M on {placement.mesh} (WSE-2), greedy, 3 new tokens per prompt; wall: reference "
          f"{t1 - t0:.1f} s, wafer emulator {t2 - t1:.1f} s (all prompts)")
    print("prompt tokens   tokens = reference   modelled TTFT      prefill tokens/s (modelled)")
    same = True
    for i, n in enumerate(args.tokens):
        ok = got[i].tokens == want[i].tokens
        same &= ok
        ttft = stats.ttft_modelled_s[i] * 1e3
        print(f"{n:>13}   {'yes' if ok else 'NO':>18}   {ttft:>11.3f} ms   {rates[i]:>16,.0f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
