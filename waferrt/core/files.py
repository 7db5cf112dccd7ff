"""Files the project writes (trained weights, GGUFs, fault plans, traces, pictures): checked, then written whole.

Contract: :func:`not_regular` says why an existing path is no file to write ('' when it is one or does not
exist yet): a directory, a device node, a FIFO or a socket is refused, never replaced by a regular file nor
written into (a FIFO with no reader blocks forever). :func:`atomic_path` is a context manager that yields a
temporary path in the same directory (same suffix, so that a writer that goes by it -- matplotlib -- writes the
same format); when the block ends the file is flushed to disk (fsync) and renamed over `path` in one step, so
that `path` holds the old file or the whole new one, never a part: a full disk, a permission refused or a
Ctrl-C leaves the old file as it was and no temporary behind. :func:`atomic_open` is the same as an open file
("w" or "wb"). An OSError while writing becomes :class:`WriteError`, one line naming the path, the reason and
what to do (the CLI prints it and exits 2); the new file gets the old one's permission bits, or the umask's.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


class WriteError(OSError):
    """A file could not be written (a full disk, no permission, not a regular file); the old one is intact."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()  # what open() would give a new file


def not_regular(path: str | Path) -> str:
    """Why `path` cannot be written as a file ('' when it is a regular file or does not exist yet)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ""
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "is a directory"
    return "is not a regular file (a device, a FIFO or a socket): writing there would replace it or block"


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to `path` to write; renamed over `path` once the block ends (module docstring)."""
    path = Path(path)
    why = not_regular(path)
    if why:
        raise WriteError(f"cannot write {path}: it {why}; give the name of a regular file")
    tmp = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".part{path.suffix}", dir=path.parent)
        tmp = Path(name)
        try:
            os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode) if path.exists() else _MODE)
        finally:
            os.close(fd)
        yield tmp
        done = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(done)  # the bytes on disk before the name points at them
        finally:
            os.close(done)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        if isinstance(e, WriteError):
            raise
        kept = " (the file that was there is kept)" if path.exists() else ""
        raise WriteError(f"cannot write {path}: {e.strerror or e}{kept}; free some space or give a path you can "
                         "write to") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """`path` opened for writing ("w" or "wb"), written whole or not at all (:func:`atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a new file: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f
