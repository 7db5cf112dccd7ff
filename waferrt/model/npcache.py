"""The dequantised model on disk: a GGUF read once, then memory-mapped from .npy files on every later run.

Contract: :func:`load_model(path, cache=True)` returns what ``gguf_loader.load_gguf`` returns (config,
float32 weights, tokenizer metadata). The first time a GGUF is seen it is dequantised and written to
``<cache>/<key>/`` (one .npy per tensor and ``meta.json`` with the config and the tokenizer metadata);
later runs read ``meta.json`` and memory-map the .npy files (read-only float32 arrays: nothing is copied
until it is used). ``<key>`` hashes the GGUF's size and its first and last MiBs, so an edited or replaced
file gets a new entry; an entry is written into a temporary directory and renamed, so a crash never
leaves half of one. The entry is derived data and is checked before it is trusted: ``meta.json`` records
each .npy file's size and CRC-32 (zlib.crc32 of its bytes, computed when written); when the entry is
mapped every file is checked against them (:func:`damaged`: a missing, truncated, grown or overwritten
file), and a damaged entry is said so on one line (the ``waferrt.cache`` logger: which file, why,
rebuilding) and rebuilt from the GGUF. An entry written without checks is rebuilt once.
:func:`load_meta` returns only (config, tokenizer metadata), from the cache when it
holds the model, else from the GGUF's metadata (fast: no tensor is dequantised). ``<cache>`` is
$WAFERRT_CACHE, else $XDG_CACHE_HOME/waferrt, else ~/.cache/waferrt; ``cache=False`` bypasses it. A cached
array can travel as a :class:`MappedArray` (file, offset, shape: a few bytes) to a process on the same
machine, which maps the file itself (:func:`by_reference`, :func:`resolve`): nothing is copied on the way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import LlamaConfig
from .weights import LayerWeights, LlamaWeights

EDGE = 1 << 20  # bytes hashed at each end of the file
LOG = logging.getLogger("waferrt.cache")  # a damaged entry, rebuilt: one warning line (stderr unless configured)


@dataclass(frozen=True)
class MappedArray:
    """An array of a cached .npy file, by reference."""

    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    def load(self) -> np.ndarray:
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)

    def read_rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1-1, read from the file (not mapped: a large table is never held whole)."""
        row = int(np.prod(self.shape[1:], dtype=np.int64))
        itemsize = np.dtype(self.dtype).itemsize
        return np.fromfile(self.path, self.dtype, (r1 - r0) * row, offset=self.offset + r0 * row * itemsize
                           ).reshape((r1 - r0, *self.shape[1:]))


def by_reference(x):
    """`x` (an array, a tuple of them, or a dataclass of them such as LayerWeights) with every array mapped
    from a file replaced by its MappedArray."""
    if isinstance(x, np.memmap) and x.filename is not None and x.flags.c_contiguous:
        return MappedArray(str(x.filename), int(x.offset), tuple(x.shape), x.dtype.str)
    return _each(x, by_reference)


def resolve(x):
    """`x` with every MappedArray replaced by the array it refers to (mapped here)."""
    return x.load() if isinstance(x, MappedArray) else _each(x, resolve)


def _each(x, fn):
    if type(x) is tuple:  # a plain tuple (not a value such as a Coord)
        return tuple(fn(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: fn(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


def cache_root() -> Path:
    if os.environ.get("WAFERRT_CACHE"):
        return Path(os.environ["WAFERRT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "waferrt"


def _gguf(path) -> Path:
    from .gguf_loader import smollm2_path

    return smollm2_path() if path is None else Path(path)


def _key(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(EDGE))
        f.seek(max(size - EDGE, 0))
        h.update(f.read(EDGE))
    return h.hexdigest()[:24]


def _entry(path) -> Path | None:
    """The cache entry of the GGUF at `path` (None when the file does not exist: the loader says why)."""
    path = _gguf(path)
    return cache_root() / _key(path) if path.is_file() else None


def cached(path=None) -> bool:
    """Does the cache hold the model at `path` (default: SmolLM2)?"""
    entry = _entry(path)
    return entry is not None and (entry / "meta.json").is_file()


def load_meta(path=None, cache: bool = True):
    """(config, tokenizer metadata) of the model, without dequantising anything."""
    entry = _entry(path) if cache else None
    if entry is not None and (entry / "meta.json").is_file():
        try:
            return _read_meta(entry)
        except (ValueError, KeyError, TypeError):  # a damaged meta.json: load_model says so and rebuilds it
            pass
    from .gguf_loader import GGUFModel

    model = GGUFModel(path)
    return model.config, model.tokenizer


def load_model(path=None, cache: bool = True):
    """(config, float32 weights, tokenizer metadata): from the cache when its entry is whole, or from the GGUF
    (then cached; a damaged entry is said so and rebuilt)."""
    from .gguf_loader import load_gguf

    entry = _entry(path) if cache else None
    if entry is None:
        return load_gguf(path)
    if (entry / "meta.json").is_file():
        why = damaged(entry)
        if not why:
            config, tok = _read_meta(entry)
            return config, _read_weights(entry, config), tok
        LOG.warning("waferrt: the weights cache %s: %s; rebuilding it from the GGUF", entry, why)
        shutil.rmtree(entry, ignore_errors=True)
    config, weights, tok = load_gguf(path)
    _write(entry, config, weights, tok)
    return config, weights, tok


def damaged(entry: Path) -> str:
    """What is wrong with a cache entry's files ('' when each has the size and CRC-32 meta.json recorded)."""
    try:
        checks = json.loads((entry / "meta.json").read_text())["checks"]
    except (OSError, ValueError, KeyError, TypeError):
        return "meta.json is unreadable or has no checksums (written by an older waferrt)"
    for name, (size, crc) in checks.items():
        file = entry / name
        try:
            got = file.stat().st_size
        except OSError as e:
            return f"{name} cannot be read ({e.strerror})"
        if got != size:
            return f"{name} is {got:,} bytes, not the {size:,} written (truncated or grown)"
        if _crc32(file) != crc:
            return f"{name} does not match its checksum (CRC-32 {crc:08x}): its bytes changed since it was written"
    return ""


def _crc32(file: Path) -> int:
    """zlib.crc32 of the file's bytes, through a read-only mapping (what is read stays in the page cache for
    the arrays mapped next)."""
    with open(file, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return zlib.crc32(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return zlib.crc32(m)


def _arrays(weights: LlamaWeights) -> dict[str, np.ndarray]:
    out = {"embed": weights.embed, "final_norm": weights.final_norm}
    if not weights.tied:
        out["head"] = weights.head
    for i, lw in enumerate(weights.layers):
        out.update({f"layers.{i}.{name}": a for name, a in lw.arrays().items()})
    return out


def _write(entry: Path, config: LlamaConfig, weights: LlamaWeights, tok) -> None:
    """Write the entry (best effort: a full disk or a read-only home only costs the next run the time; a
    run that wrote the same entry first wins)."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=entry.parent))
        checks = {}
        for name, a in _arrays(weights).items():
            np.save(tmp / f"{name}.npy", a)
            checks[f"{name}.npy"] = ((tmp / f"{name}.npy").stat().st_size, _crc32(tmp / f"{name}.npy"))
        meta = {"config": dataclasses.asdict(config), "tokenizer": dataclasses.asdict(tok), "checks": checks}
        (tmp / "meta.json").write_text(json.dumps(meta))
        tmp.rename(entry)
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _read_meta(entry: Path):
    from .tokenizer import TokenizerMetadata

    meta = json.loads((entry / "meta.json").read_text())
    tok = meta["tokenizer"]
    tok = TokenizerMetadata(**{k: tuple(v) if isinstance(v, list) else v for k, v in tok.items()})
    return LlamaConfig(**meta["config"]), tok


def _read_weights(entry: Path, config: LlamaConfig) -> LlamaWeights:
    def load(name: str) -> np.ndarray:
        return np.load(entry / f"{name}.npy", mmap_mode="r")

    embed = load("embed")
    names = LayerWeights.shapes(config)
    layers = tuple(LayerWeights(**{name: load(f"layers.{i}.{name}") for name in names}) for i in range(config.n_layers))
    weights = LlamaWeights(embed, layers, load("final_norm"), embed if config.tie_embeddings else load("head"))
    weights.check(config)
    return weights
