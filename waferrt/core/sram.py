"""SRAM accounting for the cores of one tile: every byte placed on a core is booked against its budget.

Contract: :class:`SramBook` keeps, per core of a tile (a (rows, cols) int64 array) and per named tensor,
the bytes in use. ``reserve(name, region, nbytes)`` books ``nbytes`` (a scalar, or a (rows, cols) array
over ``region``) on every core of ``region`` (global coordinates, inside the tile) and raises
:class:`SramOverflow` -- naming the tensor, the first core that overflows, bytes asked and bytes free --
without booking anything when one core would overflow. ``release(name)`` frees a tensor everywhere.
"""

from __future__ import annotations

import numpy as np

from .mesh import Coord, Region


class SramOverflow(MemoryError):
    """Placing a tensor would exceed a core's SRAM."""

    def __init__(self, tensor: str, core: Coord, asked: int, free: int, capacity: int):
        self.tensor, self.core, self.asked, self.free, self.capacity = tensor, core, asked, free, capacity
        super().__init__(
            f"SRAM overflow placing {tensor!r}: core {core} was asked for {asked} bytes but has only "
            f"{free} of {capacity} bytes free. Spread the tensor over more cores (a larger region), "
            "free another tensor first, or use a spec with more SRAM per core."
        )

    def __reduce__(self):  # picklable, so it crosses Ray from a tile to the driver as itself
        return type(self), (self.tensor, self.core, self.asked, self.free, self.capacity)


class SramBook:
    def __init__(self, tile: Region, capacity: int):
        self.tile = tile
        self.capacity = int(capacity)
        self.used = np.zeros(tile.shape, dtype=np.int64)
        self._by_tensor: dict[str, tuple[Region, np.ndarray]] = {}

    def reserve(self, name: str, region: Region, nbytes) -> None:
        if name in self._by_tensor:
            raise ValueError(f"tensor {name!r} already holds SRAM on this tile; free it first")
        window = self.tile.window(region)
        asked = np.broadcast_to(np.asarray(nbytes, dtype=np.int64), region.shape)
        after = self.used[window] + asked
        over = np.argwhere(after > self.capacity)
        if len(over):
            r, c = (int(v) for v in over[0])
            free = int(self.capacity - self.used[window][r, c])
            raise SramOverflow(name, Coord(region.x0 + c, region.y0 + r), int(asked[r, c]), free,
                               self.capacity)
        self.used[window] = after
        self._by_tensor[name] = (region, asked.copy())

    def release(self, name: str) -> None:
        region, asked = self._by_tensor.pop(name)
        self.used[self.tile.window(region)] -= asked

    def holds(self, name: str) -> bool:
        return name in self._by_tensor

    def free_bytes(self) -> np.ndarray:
        """(rows, cols) bytes still free on each core of the tile."""
        return self.capacity - self.used

    def stats(self) -> dict:
        return {"capacity": self.capacity, "min": int(self.used.min()), "max": int(self.used.max()),
                "mean": float(self.used.mean()), "tensors": len(self._by_tensor)}
