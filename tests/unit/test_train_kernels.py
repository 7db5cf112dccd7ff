"""The backward of a Llama block's ops as mesh kernels (waferrt.kernels.train_ops, attention_backward), without
Ray, on square meshes of several tiles: each equals a small numpy formula written here (float32, 1e-4
relative), and what the attention's backward books equals its closed form (waferrt.core.train_cost)."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.gemm_cost import AttentionShape
from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.core.train_cost import attention_backward_cost
from waferrt.decode.kernel_net import KernelNet
from waferrt.fabric.loop import simulate
from waferrt.kernels.attention import PromptAttention
from waferrt.kernels.attention_backward import attention_backward
from waferrt.kernels.gemm import Grid
from waferrt.kernels.gemm_backward import gather, scatter
from waferrt.kernels.train_ops import (
    HeadShape,
    Norm,
    embedding_backward,
    head_backward,
    relayout,
    rmsnorm_backward,
    rope_backward,
    swiglu_backward,
)
from waferrt.model.reference import apply_rope, rope_cos_sin

MESHES = [MeshSpec(4, 4, 2, 2), MeshSpec(3, 3, 2, 3), MeshSpec(2, 2, 1, 1), MeshSpec(1, 1, 1, 1)]
IDS = [f"{m.width}x{m.height}" for m in MESHES]
RNG = np.random.default_rng(7)
T = 10


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


class Mesh:
    """A square mesh's grid, its layouts on the host, and a kernel run returning several arrays."""

    def __init__(self, mesh: MeshSpec):
        self.mesh, self.grid = mesh, Grid.of(mesh.region)

    def put(self, layout: str, mat: np.ndarray) -> np.ndarray:
        return scatter(layout, self.grid, self.mesh.region, mat)

    def heads(self, layout: str, mats: np.ndarray) -> np.ndarray:  # (H, r, c) -> (h, w, H, r/s, c/s)
        return np.stack([self.put(layout, m) for m in mats], axis=2)

    def get(self, layout: str, blocks: np.ndarray, shape) -> np.ndarray:
        return gather(layout, self.grid, blocks, *shape)

    def run(self, kernel, **arrays):
        """The kernel's outputs (a tuple of block arrays) for the whole region, and its cost."""
        shapes = []

        def flat(ctx, **a):
            outs = kernel(ctx, **a)
            shapes[:] = [o.shape[2:] for o in outs]
            return np.concatenate([o.reshape(o.shape[:2] + (-1,)) for o in outs], axis=-1)

        got, cost = simulate(self.mesh, TINY, self.mesh.region, flat, **arrays)
        cuts = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
        return [g.reshape(got.shape[:2] + s) for g, s in zip(np.split(got, cuts, axis=-1), shapes)], cost


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_rmsnorm_backward_is_the_formula(mesh):
    m, D = Mesh(mesh), 12
    x, w, dh, res = _f32(T, D), _f32(D), _f32(T, D), _f32(T, D)
    s = len(m.grid.rows)
    (dx, dw), _ = m.run(lambda ctx, **a: rmsnorm_backward(ctx, **a, norm=Norm(D, 1e-5)), x=m.put("C", x),
                        w=m.put("C", np.broadcast_to(w, (s, D))), dh=m.put("C", dh), res=m.put("C", res))
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    g = dh * w
    _close(m.get("C", dx, (T, D)), res + r * g - x * r ** 3 * (g * x).sum(-1, keepdims=True) / D)
    _close(m.get("C", dw, (1, D))[0], (dh * x * r).sum(0))


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_swiglu_backward_is_the_formula(mesh):
    m, H = Mesh(mesh), 14
    g, u, dm = _f32(T, H), _f32(T, H), _f32(T, H)
    (dg, du), _ = m.run(swiglu_backward, gate=m.put("C", g), up=m.put("C", u), dm=m.put("C", dm))
    sig = 1 / (1 + np.exp(-g))
    _close(m.get("C", dg, (T, H)), dm * u * (sig + g * sig * (1 - sig)))
    _close(m.get("C", du, (T, H)), dm * g * sig)


@pytest.mark.parametrize("hd", [16, 8])
@pytest.mark.parametrize("mesh", MESHES[:3], ids=IDS[:3])
def test_rope_backward_rotates_back(mesh, hd):
    m, heads = Mesh(mesh), 3
    cos, sin = rope_cos_sin(np.arange(T), hd, 10000.0)
    d = _f32(heads, T, hd)
    args = dict(d=m.heads("C", d), cos=m.put("C", np.repeat(cos, 2, axis=1)), sin=m.put("C", np.repeat(sin, 2, axis=1)))
    if -(-hd // len(m.grid.rows)) % 2:  # a core's block would split a pair
        with pytest.raises(ValueError, match="splits a RoPE pair"):
            m.run(lambda ctx, **a: (rope_backward(ctx, **a),), **args)
        return
    (got,), _ = m.run(lambda ctx, **a: (rope_backward(ctx, **a),), **args)
    for h in range(heads):  # the rotation's transpose: by minus the angle
        _close(m.get("C", got[:, :, h], (T, hd)), apply_rope(d[h], cos, -sin))


@pytest.mark.parametrize("pair", [("C", "A"), ("A", "C"), ("C", "B"), ("B", "C")])
def test_relayout_moves_every_block_where_the_other_layout_wants_it(pair):
    m, mat = Mesh(MESHES[0]), _f32(T, 9)
    (got,), cost = m.run(lambda ctx, buf: (relayout(ctx, buf, *pair),), buf=m.put(pair[0], mat))
    np.testing.assert_array_equal(m.get(pair[1], got, mat.shape), mat)


def _attention_numpy(q, k, v, do):
    """dQ, dK, dV of causal GQA attention: q, do (H, T, hd), k, v (G, T, hd)."""
    rep, scale = q.shape[0] // k.shape[0], 1 / np.sqrt(q.shape[-1])
    k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
    s = np.where(np.tril(np.ones((T, T), bool)), scale * q @ k.swapaxes(1, 2), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = do @ v.swapaxes(1, 2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    group = lambda a: a.reshape(-1, rep, T, a.shape[-1]).sum(1)  # noqa: E731
    return ds @ k, group(ds.swapaxes(1, 2) @ q), group(p.swapaxes(1, 2) @ do)


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_attention_backward_is_the_formula_and_books_its_closed_form(mesh):
    m, H, G, hd = Mesh(mesh), 4, 2, 8
    q, k, v, do = _f32(H, T, hd), _f32(G, T, hd), _f32(G, T, hd), _f32(H, T, hd)
    prompt = PromptAttention(T, 1 / np.sqrt(hd))
    (got,), cost = m.run(lambda ctx, **a: (attention_backward(KernelNet(ctx), **a, prompt=prompt),), q=m.heads("C", q),
                         k=m.heads("C", k), v=m.heads("C", v), do=m.heads("C", do))
    want = _attention_numpy(q, k, v, do)
    for h in range(H):
        _close(m.get("C", got[:, :, 0, h], (T, hd)), want[0][h])
    for h in range(G):
        _close(m.get("B", got[:, :, 1, h], (T, hd)), want[1][h])
        _close(m.get("B", got[:, :, 2, h], (T, hd)), want[2][h])
    side = len(m.grid.rows)
    assert cost["attention_backward"] == attention_backward_cost(TINY, AttentionShape(T, hd, H, side), 6, G)


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_the_tied_head_and_the_embedding_backward_are_the_formulas(mesh):
    m, V, D = Mesh(mesh), 11, 6
    h, e, dx = _f32(T, D), _f32(V, D), _f32(T, D)
    targets, ids = RNG.integers(0, V, T), RNG.integers(0, V, T)
    onehot, onehot_ids = np.eye(V, dtype=np.float32)[targets], np.eye(V, dtype=np.float32)[ids]
    (loss, dh, de), _ = m.run(lambda ctx, **a: head_backward(ctx, **a, vocab=HeadShape(V, T)), h=m.put("C", h),
                              e=m.put("B", e), onehot=m.put("A", onehot))
    logits = h @ e.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dl = (p - onehot) / T
    _close(loss[0, 0, 0], -np.log(p[np.arange(T), targets]).mean())
    _close(m.get("C", dh, (T, D)), dl @ e)
    _close(m.get("B", de, (V, D)), dl.T @ h)
    (demb,), _ = m.run(lambda ctx, **a: (embedding_backward(ctx, **a),), onehot=m.put("A", onehot_ids),
                       dx=m.put("C", dx))
    want = np.zeros((V, D), np.float32)
    np.add.at(want, ids, dx)  # the scatter-add
    _close(m.get("B", demb, (V, D)), want)
