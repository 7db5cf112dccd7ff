"""The model a command runs: its shape and tokenizer at once, its weights in the background.

Contract: ``ModelLoad(name, cache)`` reads the model's metadata right away ('smollm2' for the packaged
SmolLM2-135M, or a GGUF path; from the dequantised cache when it holds the model, waferrt.model.npcache)
and starts loading the float32 weights in a thread, so that Ray and the tile actors can start meanwhile.
``config`` and ``tokenizer`` are ready at once; ``weights()`` waits for the weights (and raises what the
loading raised); ``thread`` is the loading thread (to show progress while it runs). A missing or
unreadable model raises FileNotFoundError / ValueError from the constructor. What `generate` and `chaos` share:
:func:`open_model` (a ModelLoad from the command's arguments, its errors as UsageError), :func:`prompt_requests`
(prompts as GenRequests), :func:`ready_weights` (waits for the weights, saying where they came from).
:func:`searched_mesh` is the scheduler's default mesh bounded in time (a progress line, then a UsageError naming
--mesh/--spec); :func:`default_mesh_cached` remembers it per model shape in the same cache directory.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from .common import UsageError, say, stamp


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


SEARCH_S = 120.0  # the default mesh's search gives up after this long (SmolLM2's takes seconds; a model far
                  # smaller than the spec's cores tries thousands of meshes)
SEARCH_SAY_S = 10.0  # a progress line this often while it searches


def searched_mesh(config, spec, kv, options, deadline_s: float = SEARCH_S):
    """scheduler.default_mesh, bounded in time: a progress line on stderr every SEARCH_SAY_S, and after
    `deadline_s` a UsageError naming what to give instead (--mesh/--tile of a mesh the model was placed on,
    or a smaller --spec)."""
    from waferrt.scheduler.placement import mesh_tries, no_default_mesh

    t0 = last = time.monotonic()
    placed = None  # the first mesh the model was placed on (regions across tiles or few spares): a --mesh to give
    for n, t in enumerate(mesh_tries(config, spec, kv, options=options), 1):
        if t.wanted:
            return t.mesh
        placed = placed or (t.mesh if t.planned else None)
        now = time.monotonic()
        if now - last >= SEARCH_SAY_S:
            say(f"searching the default mesh: {n} meshes tried in {now - t0:.0f} s, the last {t.mesh}")
            last = now
        if now - t0 >= deadline_s:
            give = (f"give --mesh {placed.width}x{placed.height} --tile {placed.tile_w}x{placed.tile_h} (the model "
                    "fits there, some region across a tile border)" if placed else "give --mesh WxH")
            raise UsageError(f"no default mesh found for this model on {spec.name} in {deadline_s:.0f} s ({n} meshes "
                             f"tried; a model far smaller than a {spec.name} wafer has thousands): {give}, or a "
                             "smaller --spec (e.g. --spec tiny for a tiny model)")
    raise no_default_mesh(spec, kv)


def default_mesh_cached(config, spec, kv, dtype: str, strategy=None, attention=None):
    """searched_mesh, remembered in the cache directory (the search takes seconds; its answer for
    the same model shape, spec, K/V reserve, dtype, strategy and sparse attention never changes)."""
    import dataclasses
    import hashlib
    import json

    from waferrt.core.files import atomic_open
    from waferrt.core.mesh import MeshSpec
    from waferrt.model.npcache import cache_root
    from waferrt.scheduler import PlanOptions

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
    mesh = searched_mesh(config, spec, kv, options)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path) as f:  # another run reading it meanwhile sees the old one or none
            f.write(json.dumps([mesh.width, mesh.height, mesh.tile_w, mesh.tile_h]))
    except OSError:  # a read-only home only costs the next run the search
        pass
    return mesh


def open_model(args):
    """The model's config and tokenizer (from the dequantised cache, or the GGUF's header); its weights load
    in the background meanwhile (waferrt.cli.model.ModelLoad)."""
    say("reading the model (config, tokenizer)...")
    try:
        model = ModelLoad(args.model, cache=not args.no_cache)
        return model, model.tokenizer
    except (FileNotFoundError, ValueError) as e:  # no file, not a (whole) GGUF, not a llama, unsupported
        raise UsageError(f"cannot load --model: {e}") from None


def prompt_requests(args, tok, texts: list[str]) -> list:
    """The prompts as requests: each text (in the chat template under --chat) encoded, with --max-new-tokens
    and the tokenizer's stop ids."""
    from waferrt.serving import GenRequest

    out = []
    for i, text in enumerate(texts):
        try:
            ids = tok.encode(tok.chat_prompt(text, args.system) if args.chat else text)
        except ValueError as e:  # characters the vocabulary cannot spell
            raise UsageError(f"prompt {i} ({text[:40]!r}): {e}") from None
        out.append(GenRequest(tuple(ids), args.max_new_tokens, tuple(tok.stop_ids)))
    return out


def ready_weights(model):
    """The float32 weights (waits for the background load; a cached model maps them in a second)."""
    from .progress import waiting

    what = "mapping from the cache" if model.cached else "dequantising the GGUF, cached for later runs"
    waiting(f"model weights ({what})", model.thread, stamp())
    try:
        weights = model.weights()
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"cannot load --model: {e}") from None
    c = model.config
    say(f"weights ready ({model.seconds:.1f}s{', from the cache' if model.cached else ''}): {c.n_layers} "
        f"layers, dim {c.dim}, {c.params() / 1e6:.0f}M parameters")
    return weights
