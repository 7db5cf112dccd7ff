"""The model a command runs: its shape and tokenizer at once, its weights in the background.

Contract: ``ModelLoad(name, cache)`` reads the model's metadata right away ('smollm2' for the packaged
SmolLM2-135M, or a GGUF path; from the dequantised cache when it holds the model, waferrt.model.npcache)
and starts loading the float32 weights in a thread, so that Ray and the tile actors can start meanwhile.
``config`` and ``tokenizer`` are ready at once; ``weights()`` waits for the weights (and raises what the
loading raised). A missing or unreadable model raises FileNotFoundError / ValueError from the constructor.
"""

from __future__ import annotations

import threading
import time


class ModelLoad:
    def __init__(self, name: str, cache: bool = True):
        from waferrt.model import Tokenizer, load_meta
        from waferrt.model.npcache import cached

        self.path, self.cache = (None if name == "smollm2" else name), cache
        self.cached = cache and cached(self.path)
        self.config, meta = load_meta(self.path, cache)
        self.tokenizer = Tokenizer(meta)
        self._weights, self._error, self.seconds = None, None, 0.0
        self._thread = threading.Thread(target=self._load, daemon=True, name="model-weights")
        self._thread.start()

    def _load(self) -> None:
        from waferrt.model import load_model

        t0 = time.perf_counter()
        try:
            self._weights = load_model(self.path, self.cache)[1]
        except BaseException as e:  # noqa: BLE001 - re-raised by weights() in the caller's thread
            self._error = e
        self.seconds = time.perf_counter() - t0

    def weights(self):
        """The float32 weights (waits for them)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._weights
