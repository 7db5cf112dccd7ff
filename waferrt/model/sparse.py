"""STAR's sparse attention as plain numpy math: predict, select, attend (issue 22).

Contract (float32 in, float32 out; GQA as in the reference: query head h reads K/V head h // n_rep):
- `AttentionMode`: ``dense`` or ``sparse:K`` (K keys kept per query head) or ``sparse:F`` (a fraction
  0 < F < 1 of the context, rounded up). `keys_kept(context)` is how many keys a query attends to.
- `predict_scores(q, k)`: STAR's log-domain estimate of q . k with additions only. Each key element is
  held as its sign and the position of its leading one (its leading-zero count, read off the float's
  exponent field: |k| ~ 2^e); the query stays as it is (the differential scheme: only one operand goes to
  the log domain). A product q * k becomes q with e added to its exponent (ldexp: an exponent addition,
  a shift in fixed point), signed by k; the dot product is then a sum. No multiplier anywhere: numpy
  computes it as q times `log_keys` (sign(k) * 2^e, so every product is exactly that exponent addition).
- `select_top(pred, keep)`: for each query head the `keep` positions of the highest predicted scores,
  ordered from the highest down (ties: the earlier position first).
- `sorted_attention(q, k, v, chosen, block)`: FlashAttention's online softmax over the chosen keys in
  that sorted order, `block` keys at a time. Because the order is by predicted score, the running max is
  (nearly always) found in the first block, so the rescale of the running sum and output that a new max
  forces -- an exponential and a pass over the accumulator -- is rare: `rescales` counts them.
- `attention(q, k, v, mode)`: the one entry point (the reference model's attention calls it).
  Sparse with keep >= context attends to every key, in the predicted order: equal to dense to float32
  rounding (not bitwise: the softmax's sum and p @ v add the same terms in another order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

DENSE_WORD = "dense"
SPARSE_WORD = "sparse"


@dataclass(frozen=True)
class AttentionMode:
    """dense (keep=None, fraction=None), sparse:K (keep=K) or sparse:F (fraction=F, 0 < F < 1)."""

    keep: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if self.keep is not None and self.fraction is not None:
            raise ValueError("an attention mode keeps K keys or a fraction of the context, not both")
        if self.keep is not None and self.keep < 1:
            raise ValueError(f"sparse:{self.keep} keeps no key; write sparse:K with K >= 1 (e.g. sparse:64)")
        if self.fraction is not None and not 0.0 < self.fraction < 1.0:
            raise ValueError(f"sparse:{self.fraction} is not a fraction in (0, 1); write e.g. sparse:0.25")

    @property
    def dense(self) -> bool:
        return self.keep is None and self.fraction is None

    def keys_kept(self, context: int) -> int:
        """How many of `context` keys one query head attends to."""
        if self.dense:
            return context
        if self.keep is not None:
            return min(self.keep, context)
        return min(context, max(1, math.ceil(self.fraction * context)))

    def __str__(self) -> str:
        if self.dense:
            return DENSE_WORD
        return f"{SPARSE_WORD}:{self.keep if self.keep is not None else self.fraction}"

    @classmethod
    def parse(cls, word: str) -> AttentionMode:
        """'dense', 'sparse:64' or 'sparse:0.25' -> the mode; anything else raises ValueError saying what to write."""
        if word == DENSE_WORD:
            return cls()
        head, _, tail = word.partition(":")
        if head == SPARSE_WORD and tail.replace(".", "", 1).isdigit():  # a whole number or a decimal fraction
            try:
                return cls(keep=int(tail)) if tail.isdigit() else cls(fraction=float(tail))
            except ValueError as e:
                raise ValueError(f"attention {word!r}: {e}") from None
        raise ValueError(f"attention {word!r}: write dense, sparse:K (keys per head, e.g. sparse:64) or sparse:F "
                         "(a fraction of the context, e.g. sparse:0.25)")


DENSE = AttentionMode()


def leading_one(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sign and leading-one exponent of each element: x ~ sign * 2^e (e = floor(log2|x|)); zeros get sign 0.

    x (...) float32 -> sign (...) float32 in {-1, 0, 1}, e (...) int32. The exponent is the float's
    exponent field (a leading-zero count in fixed point): no logarithm is computed.
    """
    _, e = np.frexp(x)  # x = m * 2^e, 0.5 <= |m| < 1
    return np.sign(x).astype(np.float32), (e - 1).astype(np.int32)


SIGN_EXPONENT = np.int32(-(1 << 23))  # a float32's sign and exponent bits (0xFF800000): its mantissa cleared


def log_keys(k: np.ndarray) -> np.ndarray:
    """Each key element as the signed power of two below it, sign(k) * 2^e (float32, exact): what the add-only
    prediction multiplies the query by -- a product q * sign(k) * 2^e is q with e added to its exponent and its
    sign flipped, no multiplier. k (...) -> (...) float32. Read off the float's sign and exponent fields (its
    mantissa cleared); a subnormal, whose leading one lies in the mantissa, goes through `leading_one`."""
    k = np.asarray(k, np.float32)
    out = (k.view(np.int32) & SIGN_EXPONENT).view(np.float32)
    tiny = (out == 0) & (k != 0)  # subnormal
    if tiny.any():
        sign, e = leading_one(k[tiny])
        out[tiny] = np.ldexp(sign, e)
    return out


def predict_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """STAR's add-only estimate of every query head's score against every key.

    q (n_heads, hd); k (n_kv, seq, hd) -> (n_heads, seq) float32: the sum of q * sign(k) * 2^e_k (`log_keys`;
    every product an exponent addition, exactly), as a grouped product.
    """
    n_kv, seq, hd = k.shape
    qg = q.reshape(n_kv, -1, hd)  # (n_kv, n_rep, hd)
    return (qg @ log_keys(k).transpose(0, 2, 1)).reshape(-1, seq)  # (n_kv, n_rep, seq) -> (n_heads, seq)


def select_top(pred: np.ndarray, keep: int) -> np.ndarray:
    """The `keep` highest-predicted positions of each head, highest first. pred (H, seq) -> (H, keep) int."""
    order = np.argsort(-pred, axis=-1, kind="stable")  # (H, seq): ties keep the earlier position first
    return order[:, :keep]


class SortedResult(NamedTuple):
    out: np.ndarray  # (n_heads, hd) float32
    rescales: int  # (head, block) pairs after a head's first block whose new max forced a rescale


def sorted_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, chosen: np.ndarray, block: int) -> SortedResult:
    """Online-softmax attention of each head over its chosen keys, in the given order, `block` at a time.

    q (n_heads, hd); k, v (n_kv, seq, hd); chosen (n_heads, keep) positions -> SortedResult.
    """
    n_heads, hd = q.shape
    n_rep = n_heads // k.shape[0]
    kv_head = np.arange(n_heads)[:, None] // n_rep  # (n_heads, 1)
    ks, vs = k[kv_head, chosen], v[kv_head, chosen]  # (n_heads, keep, hd) each, in the sorted order
    scale = np.float32(1.0 / np.sqrt(hd))
    m = np.full((n_heads, 1), -np.inf, dtype=np.float32)  # running max
    denom = np.zeros((n_heads, 1), dtype=np.float32)  # running sum of exp(s - m)
    acc = np.zeros((n_heads, hd), dtype=np.float32)  # running sum of exp(s - m) * v
    rescales = 0
    for lo in range(0, chosen.shape[1], block):
        s = np.einsum("hd,hkd->hk", q, ks[:, lo:lo + block]) * scale  # (n_heads, b)
        m_new = np.maximum(m, np.max(s, axis=-1, keepdims=True))  # (n_heads, 1)
        if lo > 0:
            rescales += int(np.count_nonzero(m_new > m))
        alpha = np.exp(m - m_new)  # (n_heads, 1): 0 on the first block, 1 where the max stood
        p = np.exp(s - m_new)  # (n_heads, b)
        denom = denom * alpha + np.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha + np.einsum("hk,hkd->hd", p, vs[:, lo:lo + block])
        m = m_new
    return SortedResult(acc / denom, rescales)


def sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: int, block: int = 16) -> SortedResult:
    """Predict, keep the top `keep` keys per head, attend over them in sorted order.

    q (n_heads, hd); k, v (n_kv, seq, hd) -> SortedResult with out (n_heads, hd).
    """
    chosen = select_top(predict_scores(q, k), keep)  # (n_heads, keep)
    return sorted_attention(q, k, v, chosen, block)


def softmax(x: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis (-inf entries get probability 0)."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Grouped-query softmax attention over every key. q (n_heads, hd); k, v (n_kv, seq, hd) -> (n_heads, hd)."""
    n_kv, _, hd = k.shape
    qg = q.reshape(n_kv, -1, hd)  # (n_kv, n_rep, hd)
    p = softmax(qg @ k.transpose(0, 2, 1) * np.float32(1.0 / np.sqrt(hd)))  # (n_kv, n_rep, seq)
    return (p @ v).reshape(q.shape)  # (n_heads, hd)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mode: AttentionMode = DENSE) -> np.ndarray:
    """One query position over every cached key, dense or sparse. q (n_heads, hd); k, v (n_kv, seq, hd)."""
    if mode.dense:
        return dense_attention(q, k, v)
    return sparse_attention(q, k, v, mode.keys_kept(k.shape[1])).out
