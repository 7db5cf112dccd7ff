"""The model a command runs: its shape and tokenizer at once, its weights in the background.

Contract: ``ModelLoad(name, cache)`` reads the model's metadata right away ('smollm2' for the packaged
SmolLM2-135M, or a GGUF path; from the dequantised cache when it holds the model, waferrt.model.npcache)
and starts loading the float32 weights in a thread, so that Ray and the tile actors can start meanwhile.
``config`` and ``tokenizer`` are ready at once; ``weights()`` waits for the weights (and raises what the
loading raised); ``thread`` is the loading thread (to show progress while it runs). A missing or
unreadable model raises FileNotFoundError / ValueError from the constructor.
:func:`default_mesh_cached` remembers the default mesh of a model shape in the same cache directory.
"""

from __future__ import annotations

import threading
import time

import numpy as np


class ModelLoad:
    def __init__(self, name: str, cache: bool = True):
        from waferrt.model import Tokenizer, load_meta
        from waferrt.model.npcache import cached

        self.path, self.cache = (None if name == "smollm2" else name), cache
        self.cached = cache and cached(self.path)
        self.config, meta = load_meta(self.path, cache)
        self.tokenizer = Tokenizer(meta)
        self._weights, self._error, self.seconds = None, None, 0.0
        self.thread = threading.Thread(target=self._load, daemon=True, name="model-weights")
        self.thread.start()

    def _load(self) -> None:
        from waferrt.model import load_model

        t0 = time.perf_counter()
        try:
            self._weights = load_model(self.path, self.cache)[1]
            self.cached = self.cached and isinstance(self._weights.embed, np.memmap)  # not when it was rebuilt
        except BaseException as e:  # noqa: BLE001 - re-raised by weights() in the caller's thread
            self._error = e
        self.seconds = time.perf_counter() - t0

    def weights(self):
        """The float32 weights (waits for them)."""
        self.thread.join()
        if self._error is not None:
            raise self._error
        return self._weights


def default_mesh_cached(config, spec, kv, dtype: str, strategy=None, attention=None):
    """scheduler.default_mesh, remembered in the cache directory (the search takes seconds; its answer for
    the same model shape, spec, K/V reserve, dtype, strategy and sparse attention never changes)."""
    import dataclasses
    import hashlib
    import json

    from waferrt.core.files import atomic_open
    from waferrt.core.mesh import MeshSpec
    from waferrt.model.npcache import cache_root
    from waferrt.scheduler import PlanOptions, default_mesh

    parts = [dataclasses.asdict(config), spec.as_dict(), dataclasses.asdict(kv), dtype]
    if strategy is not None and strategy.group > 1:  # (one layer per region keeps its key of before)
        parts.append(strategy.group)
    if attention is not None and not attention.dense:  # (dense keeps its key of before)
        parts.append(str(attention))
    key = json.dumps(parts, sort_keys=True)
    path = cache_root() / "meshes" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    try:
        return MeshSpec(*json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    options = PlanOptions(dtype=dtype, strategy=strategy)
    if attention is not None:
        options = dataclasses.replace(options, attention=attention)
    mesh = default_mesh(config, spec, kv, options=options)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path) as f:  # another run reading it meanwhile sees the old one or none
            f.write(json.dumps([mesh.width, mesh.height, mesh.tile_w, mesh.tile_h]))
    except OSError:  # a read-only home only costs the next run the search
        pass
    return mesh
