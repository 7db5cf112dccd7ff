"""STAR's sparse attention decoding on tile actors over Ray (waferrt.decode.sparse): with K at or above the
context the tokens and logits are dense's exactly; with fewer keys, the numpy reference's sparse tokens."""

import numpy as np
import pytest

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.llm import WaferLLM
from waferrt.model import AttentionMode, ReferenceModel, Sampler, synthetic_llama, tiny_config
from waferrt.scheduler import KVReserve, PlanOptions, plan
from waferrt.serving import GenRequest

CFG = tiny_config()
W = synthetic_llama(CFG, seed=0)
REQUESTS = [GenRequest((5, 6, 7, 8, 9, 10, 11), 14), GenRequest((100, 3), 9)]  # seeded short prompts


def on_tiles(mesh: MeshSpec, mode: AttentionMode):
    """Planned with room for sparse:24's top-K lists (the most these tests keep), whatever `mode` runs."""
    placement = plan(CFG, TINY, mesh, kv=KVReserve(24, 2), options=PlanOptions(attention=AttentionMode(keep=24)))
    with WaferLLM(CFG, W, placement).use_attention(mode) as llm:
        got, _ = llm.generate(REQUESTS, Sampler(), keep_logits=True)
    return got


def reference_tokens(mode: AttentionMode, req: GenRequest) -> list[int]:
    model = ReferenceModel(CFG, W, mode)
    cache = model.new_cache(len(req.prompt_ids) + req.max_new_tokens)
    logits, out = model.prefill(list(req.prompt_ids), cache), []
    while len(out) < req.max_new_tokens:
        out.append(int(np.argmax(logits)))
        logits = model.step(out[-1], cache.length, cache)
    return out


@pytest.mark.parametrize("mesh", [MeshSpec(16, 16, 8, 8), MeshSpec(24, 8, 8, 8)], ids=["2x2", "3x1"])
def test_sparse_at_k_above_the_context_is_dense_exactly(ray_session, mesh):
    dense, sparse = on_tiles(mesh, AttentionMode()), on_tiles(mesh, AttentionMode(keep=24))
    assert [c.tokens for c in sparse] == [c.tokens for c in dense]
    for s, d in zip(sparse, dense, strict=True):
        for a, b in zip(s.logits, d.logits, strict=True):
            np.testing.assert_array_equal(a, b)


def test_sparse_with_few_keys_decodes_the_references_sparse_tokens(ray_session):
    mode = AttentionMode(keep=3)
    got = on_tiles(MeshSpec(16, 16, 8, 8), mode)
    assert [c.tokens for c in got] == [reference_tokens(mode, r) for r in REQUESTS]
    assert [c.tokens for c in got] != [reference_tokens(AttentionMode(), r) for r in REQUESTS]
