"""Pages of a read-only file-mapped array given back once it has been read (host memory, not the wafer's).

Contract: :func:`drop_pages` tells the OS that this process no longer needs the pages of a read-only array
mapped from a file (``np.load(..., mmap_mode="r")``, ``np.memmap(..., mode="r")``: the dequantised-weights cache,
a GGUF's tensors): they leave the process's resident set at once (the file keeps them in the page cache, and
a later read maps them in again, with the same values). Anything else -- an array in memory, a writeable
mapping, a platform without ``madvise`` -- is left alone. A tile packing a layer calls it on each float32
source matrix once that matrix is converted to the storage dtype, so its peak memory holds one source matrix,
not the whole mapped layer (870 MB at Llama3-8B size). Pure Python and numpy (the stdlib's mmap).
"""

from __future__ import annotations

import mmap

import numpy as np


def drop_pages(a: np.ndarray) -> bool:
    """Give back the pages of `a` when it is a read-only view of a file mapping; True when it did."""
    if not isinstance(a, np.ndarray) or a.flags.writeable or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    base = a
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    if base is None or base.closed:
        return False
    base.madvise(mmap.MADV_DONTNEED)
    return True
