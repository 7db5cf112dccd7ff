"""A micro-batch's rows: what travels with its activations from stage to stage, its columns named.

Contract: a micro-batch is a (B, 5) int64 array, one row per item (kept as an array: it crosses the fabric
with the activations and is sliced per stage in the decode's hot loop); :class:`Col` names its columns, so
``meta[:, Col.POS]`` reads the positions, and :func:`item_row` builds one row (waferrt.serving.engine).
"""

from __future__ import annotations

from enum import IntEnum


class Col(IntEnum):
    SLOT = 0  # the request's K/V slot
    TOKEN = 1  # the token the embedding looks up
    POS = 2  # its position in the request
    WANT = 3  # 1: the head computes its logits (the request's next token), 0: a prompt token before the last
    REQUEST = 4  # the request's index (the engine's submission order)


def item_row(slot: int, token: int, pos: int, want: bool, request: int) -> tuple[int, int, int, int, int]:
    """One item's row, in Col order."""
    return slot, token, pos, int(want), request
