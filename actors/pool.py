"""Warm tile actors: a closed Wafer's healthy tiles kept for the next Wafer of this driver (opt-in).

Contract: starting a tile actor costs its Ray worker process (Python, Ray, waferrt: about a CPU-second on
the 2-core machine this project measures on, and 1 s of wall time a tile). With ``WAFERRT_KEEP_TILES=N``
(:data:`KEEP_ENV`; read at each use, 0 or unset: off, the default) a Wafer that closes hands its tiles to
this process's pool instead of killing them: a tile whose ``Tile.retire`` reports its sockets closed and no
thread of its own running is kept, up to N idle ones (the rest are killed as before). The next tile started
on the same Ray node (:func:`take`, by ``actors.remote``) is one of them, made new by ``Tile.reset``: its
attributes dropped and made again, as a new actor's are. So a kept tile holds nothing of its last Wafer, and
what a Wafer owns while open is as before; once closed, its kept processes live on (about 100 MB each) until
a Wafer takes them, :func:`drain` kills them, or the driver ends. Kept tiles are unnamed (a tile's name,
``tile(x,y)``, belongs to one Wafer's namespace). The pool belongs to one Ray session: when Ray stopped and
started again (another GCS address) it forgets what it held. A kept tile that died meanwhile is killed and
skipped. A value that is not a whole number >= 0 raises :class:`BadKeepTiles` (``Wafer.open`` asks before Ray
starts; the CLI prints it as one line, exit 2). Importing this module imports no Ray.
"""

from __future__ import annotations

import os
from collections import defaultdict

KEEP_ENV = "WAFERRT_KEEP_TILES"


class BadKeepTiles(ValueError):
    """WAFERRT_KEEP_TILES is not a whole number >= 0 (the user's to fix: the CLI prints it as one line)."""


def keep_limit() -> int:
    """How many idle tiles the pool keeps (``WAFERRT_KEEP_TILES``; 0: none). A value that is not a whole number
    >= 0 raises BadKeepTiles, naming the variable and what to write (``Wafer.open`` asks before Ray starts)."""
    raw = os.environ.get(KEEP_ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise BadKeepTiles(f"{KEEP_ENV}={raw!r}: give the most idle tile actors to keep for the next Wafer, a whole "
                         f"number >= 0 (e.g. {KEEP_ENV}=8), or unset it")
    return int(raw)


class TilePool:
    """The idle tile actors of this driver's Ray session, by Ray node."""

    def __init__(self) -> None:
        self.idle: dict[str, list] = defaultdict(list)
        self.session: str | None = None

    def _current(self) -> None:
        """Forget what another Ray session left (its actors are gone with it)."""
        import ray  # (here: the CLI asks keep_limit of every command, most of which never start Ray)

        gcs = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
        if gcs != self.session:
            self.idle.clear()
            self.session = gcs

    def count(self) -> int:
        return sum(len(v) for v in self.idle.values())

    def take(self, node: str):
        """An idle tile actor on Ray node `node`, or None (none kept, or keeping is off)."""
        if keep_limit() == 0:
            return None
        self._current()
        return self.idle[node].pop() if self.idle.get(node) else None

    def give(self, node: str, handle) -> bool:
        """Keep a retired tile actor of node `node`; False (the caller kills it) when the pool is full or off."""
        self._current()
        if self.count() >= keep_limit():
            return False
        self.idle[node].append(handle)
        return True

    def drain(self) -> None:
        """Kill every idle tile actor kept."""
        import ray

        self._current()
        for handles in self.idle.values():
            for h in handles:
                ray.kill(h, no_restart=True)
        self.idle.clear()


POOL = TilePool()
