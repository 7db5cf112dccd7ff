"""Storage dtypes: how weights and K/V may be kept in a core's SRAM (they are always computed in float32).

Contract: :data:`STORAGE_DTYPES` is the one list of storage dtypes; the CLI commands take their choices
from it and :func:`check_dtype` rejects anything else with the list; :func:`check_numpy_dtype` also
accepts numeric numpy dtype names (what a DSM tensor may hold). ``itemsize`` is bytes per element
(what SRAM booking counts). ``to_storage`` / ``to_f32`` convert between float32 and a storage dtype:
float16 is numpy's; bfloat16 is kept as the upper 16 bits of a float32 in a uint16, rounded to nearest
even. Pure numpy.
"""

from __future__ import annotations

import numpy as np

STORAGE_DTYPES = ("float32", "float16", "bfloat16")


def check_dtype(dtype: str) -> str:
    """`dtype` itself when it is a storage dtype, else a ValueError that lists the choices."""
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"storage dtype {dtype!r} is not one of {', '.join(STORAGE_DTYPES)}")
    return dtype


def check_numpy_dtype(dtype: str) -> str:
    """`dtype` when it is a storage dtype or the name of a numeric numpy dtype (a DSM tensor may be
    'int32'), else a TypeError/ValueError that says what is allowed."""
    if not isinstance(dtype, str):
        raise TypeError(f"a dtype is given by name, e.g. 'float32'; got {dtype!r} of type {type(dtype).__name__}")
    if dtype in STORAGE_DTYPES:
        return dtype
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = ""
    if kind not in ("b", "i", "u", "f"):
        raise ValueError(f"dtype {dtype!r} is not a numeric numpy dtype name; use one of "
                         f"{', '.join(STORAGE_DTYPES)}, or e.g. 'int32' for a DSM tensor")
    return dtype


def itemsize(dtype: str) -> int:
    """Bytes per element of a storage dtype (or of any numpy dtype name, for DSM tensors)."""
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def stored_nbytes(a: np.ndarray, dtype: str) -> int:
    """Bytes of a weight block at the storage dtype, whether the host holds it so or widened to float32."""
    return a.size * itemsize(dtype) if a.dtype == np.float32 else a.nbytes


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds a storage dtype (bfloat16: uint16 bits)."""
    return np.dtype(np.uint16 if check_dtype(dtype) == "bfloat16" else dtype)


def to_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> storage (bfloat16 rounds to nearest even)."""
    if dtype == "float32":
        return np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "float16":
        return a.astype(np.float16)
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def to_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    """storage -> float32 for computing (a no-op for float32, and for a block the host already widened to
    float32: waferrt.decode.shards.in_float32)."""
    if dtype == "float32" or a.dtype == np.float32:
        return a
    if dtype == "float16":
        return a.astype(np.float32)
    return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
