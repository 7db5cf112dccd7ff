"""Causal attention over a prompt as mesh GEMMs (waferrt.kernels.attention) without Ray: equal to numpy's
causal softmax attention on square meshes of one and several tiles, prompts that do and do not fill whole
blocks; the skew leaves every column rotated by its ring index; what it books equals
waferrt.core.gemm_cost.attention_cost."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.gemm_cost import AttentionShape, attention_cost
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.decode.decoding import ELEMENTWISE_FLOPS
from waferrt.decode.kernel_net import KernelNet
from waferrt.fabric.loop import simulate
from waferrt.kernels.attention import PromptAttention, causal_attention, skew
from waferrt.kernels.gemm import Grid, collect, spread

SOFTMAX = ELEMENTWISE_FLOPS["softmax"]  # what the KernelNet records per softmax element


def _kernel(prompt: PromptAttention):
    """The causal attention as a kernel of ctx, on the kernel's KernelNet."""
    return lambda ctx, **blocks: causal_attention(KernelNet(ctx), **blocks, prompt=prompt)


def _numpy_attention(q, k, v, scale):
    s = (q @ k.T) * scale
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize("mesh, tokens, hd, heads", [
    (MeshSpec(4, 4, 2, 2), 16, 8, 1), (MeshSpec(4, 4, 2, 2), 13, 6, 3), (MeshSpec(3, 3, 3, 3), 8, 6, 2),
    (MeshSpec(5, 5, 2, 3), 23, 10, 2), (MeshSpec(1, 1, 1, 1), 5, 4, 2), (MeshSpec(2, 2, 1, 1), 9, 4, 1)],
    ids=["4x4/2x2 whole", "4x4/2x2 padded", "3x3 one tile", "5x5 uneven tiles", "1x1", "2x2 four tiles"])
def test_causal_attention_equals_numpy_and_its_closed_form(mesh, tokens, hd, heads):
    rng = np.random.default_rng(tokens)
    q, k, v = (rng.standard_normal((heads, tokens, hd)).astype(np.float32) for _ in range(3))
    grid, region, scale = Grid.of(mesh.region), mesh.region, 1 / np.sqrt(hd)
    blocks = {n: np.stack([spread(grid, region, m[h]) for h in range(heads)], axis=2)
              for n, m in (("q", q), ("k", k), ("v", v))}
    kernel = _kernel(PromptAttention(tokens, scale))
    out, cost = simulate(mesh, TINY, region, kernel, **blocks)
    for h in range(heads):
        np.testing.assert_allclose(collect("meshgemm", grid, out[:, :, h], tokens, hd),
                                   _numpy_attention(q[h], k[h], v[h], scale), rtol=1e-4, atol=1e-5)
    assert cost["attention"] == attention_cost(TINY, AttentionShape(tokens, hd, heads, mesh.width), SOFTMAX)


def test_skew_rotates_each_column_by_its_ring_index():
    mesh = MeshSpec(5, 5, 2, 2)
    grid = Grid.of(mesh.region)
    m = np.arange(25, dtype=np.float32).reshape(5, 5)
    blocks = spread(grid, mesh.region, m)
    out, _ = simulate(mesh, TINY, mesh.region, lambda ctx, b: _in_op(ctx, skew, b, "y"), b=blocks)
    got = collect("meshgemm", grid, out, 5, 5)
    want = np.stack([np.roll(m[:, c], -c) for c in range(5)], axis=1)  # core (i, c) holds (i + c, c)
    np.testing.assert_array_equal(got, want)


def _in_op(ctx, fn, *args):
    with ctx.ledger.op("skew"):
        return fn(ctx, *args)


def test_a_non_square_region_is_refused_with_what_to_give():
    mesh = MeshSpec(4, 2, 2, 2)
    z = np.zeros((2, 4, 1, 1, 1), np.float32)
    kernel = _kernel(PromptAttention(2, 1.0))
    with pytest.raises(ValueError, match="square region"):
        simulate(mesh, TINY, mesh.region, kernel, q=z, k=z, v=z)


def test_sparse_attention_moves_a_query_kept_values_of_scores_and_probabilities() -> None:
    """16 tokens, head_dim 8, 2 heads on a 2x2 square (8 queries and 8 keys a block), kept 3 against dense:
    only the score accumulators and P move smaller, by (8 - 3) values x 2 heads x 8 queries x 4 bytes = 320
    bytes a block. On the 2-place rings (2 rings a direction, 2 hops of links round each) a move of them is
    2 x 2 x 320 = 1,280 link bytes; the accumulators move twice (after each of the 2 steps), P once: 3,840."""
    dense = attention_cost(TINY, AttentionShape(16, 8, 2, 2), SOFTMAX)
    sparse = attention_cost(TINY, AttentionShape(16, 8, 2, 2, kept=3), SOFTMAX)
    assert dense.link_bytes - sparse.link_bytes == 3_840
    assert dense.flops > sparse.flops
