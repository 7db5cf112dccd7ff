"""What crosses a link is checked: a checksum of every payload, and the bit flips a Corrupt fault makes.

Contract: :func:`checksum` is a fast hash (CRC-32, chained) of a message's arrays, computed by the sender
and checked by the receiver on every message of both fabrics; :func:`flip` returns copies of the arrays
with `bits` bits flipped at places drawn from `rng` (the sender corrupts after it has computed the
checksum: the flips happen on the wire). Pure: numpy and zlib.
"""

from __future__ import annotations

import random
import zlib

import numpy as np


def checksum(arrays: list[np.ndarray]) -> int:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8), crc)
    return crc


def flip(arrays: list[np.ndarray], bits: int, rng: random.Random) -> list[np.ndarray]:
    """Copies of `arrays` with `bits` bits flipped (in the arrays that have bytes)."""
    out = [np.array(a, copy=True, order="C") for a in arrays]  # C order: the flat view below is a view
    sized = [i for i, a in enumerate(out) if a.nbytes]
    for _ in range(bits if sized else 0):
        a = out[rng.choice(sized)]
        raw = a.reshape(-1).view(np.uint8)
        byte = rng.randrange(raw.size)
        raw[byte] ^= np.uint8(1 << rng.randrange(8))
    return out
