"""B sequences on a square of cores, laid out so that attention runs per sequence.

Contract: a batch of B sequences of S tokens (``core.train_cost.TrainShape``) lies on a side x side square
with each sequence cut in `side` slices of sb = cdiv(S, side) tokens (the last zero-padded) and token block i
-- what core row i holds in the C layout -- made of every sequence's slice i, one after another: B * sb rows,
``core.train_cost.square_tokens`` in all. Every token-wise op (the GEMMs, the norms, RoPE, SwiGLU) is blind to
the order; the attention then finds each core's block to be B sequences' blocks side by side and runs them as
B times the heads (:func:`fold`, :func:`unfold`: a view of a core's own block, no move), so a sequence never
scores another's keys -- a B*S x B*S score block would be B times the work and the traffic.

Host side (the order the host puts tokens in and reads them back): :func:`interleave` (B*S, ...) -> the
square's rows, :func:`deinterleave` back. One sequence (B = 1) is the plain order, padded to side * sb.
"""

from __future__ import annotations

import numpy as np

from waferrt.core.train_cost import TrainShape, square_tokens


def _slices(shape: TrainShape, side: int) -> int:
    return square_tokens(shape, side) // (shape.batch * side)  # sb: a sequence's tokens a core row


def interleave(mat: np.ndarray, shape: TrainShape, side: int) -> np.ndarray:
    """(B*S, ...) -- the B sequences one after another -- -> (square_tokens, ...) in the square's order."""
    B, S, sb, rest = shape.batch, shape.seq, _slices(shape, side), mat.shape[1:]
    if mat.shape[0] != shape.tokens:
        raise ValueError(f"{mat.shape[0]} token rows are not {B} sequences of {S}: give (B*S, ...) rows")
    padded = np.zeros((B, side * sb) + rest, mat.dtype)
    padded[:, :S] = mat.reshape((B, S) + rest)
    return padded.reshape((B, side, sb) + rest).swapaxes(0, 1).reshape((-1,) + rest)


def deinterleave(mat: np.ndarray, shape: TrainShape, side: int) -> np.ndarray:
    """The square's (square_tokens, ...) rows -> (B*S, ...), the padding dropped."""
    B, S, sb, rest = shape.batch, shape.seq, _slices(shape, side), mat.shape[1:]
    seqs = mat[:square_tokens(shape, side)].reshape((side, B, sb) + rest).swapaxes(0, 1)
    return seqs.reshape((B, side * sb) + rest)[:, :S].reshape((B * S,) + rest)


def fold(buf: np.ndarray, sequences: int) -> np.ndarray:
    """A core's heads' blocks (rows, cols, H, B*sb, ...) -> (rows, cols, B*H, sb, ...): sequence b's head h at
    b*H + h (so query head b*H + h reads K/V head b*G + h // (H/G), GQA's rule over the folded heads)."""
    rows, cols, heads, mb = buf.shape[:4]
    parts = buf.reshape((rows, cols, heads, sequences, mb // sequences) + buf.shape[4:])
    return parts.swapaxes(2, 3).reshape((rows, cols, sequences * heads, mb // sequences) + buf.shape[4:])


def unfold(buf: np.ndarray, sequences: int) -> np.ndarray:
    """:func:`fold`'s inverse: (rows, cols, B*H, sb, ...) -> (rows, cols, H, B*sb, ...)."""
    rows, cols, bh, sb = buf.shape[:4]
    parts = buf.reshape((rows, cols, sequences, bh // sequences, sb) + buf.shape[4:])
    return parts.swapaxes(2, 3).reshape((rows, cols, bh // sequences, sequences * sb) + buf.shape[4:])
