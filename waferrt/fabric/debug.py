"""What makes a kernel debuggable: where in the user's code something happened, and what the kernel printed.

Contract: :func:`user_site` is the innermost frame of the user's own code (not waferrt, not an installed package,
not the standard library) of a traceback or of the current stack, as a :class:`Site` (file, line, function, the
line's text). :func:`locate` adds to an exception raised in a kernel where it happened -- the attributes
``kernel_site`` (a Site), ``tile`` (a TileId: the error's ``blame`` where it names another tile at fault) and, when
known, ``core`` (a Coord) -- and a note (``add_note``: shown under its traceback) saying so; :class:`KernelFailed`
carries a kernel's exception, its site, its tile and what it printed from a tile to the host (any exception pickles
inside it, its own attributes with it). :class:`TileOutput` captures what ``print`` writes (to stdout or stderr) in
the threads that ask for it (each tile's kernel its own buffer, even when tiles are threads of one process); other
threads print as before. Pure: the standard library only.
"""

from __future__ import annotations

import io
import os
import sys
import sysconfig
import threading
from contextlib import contextmanager
from dataclasses import dataclass

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the waferrt package
_LIBS = tuple({os.path.abspath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                             sysconfig.get_paths()["platlib"])})


@dataclass(frozen=True)
class Site:
    """A line of the user's code: file, line number, function and the line's text."""

    file: str
    line: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        code = f": {self.code}" if self.code else ""
        return f"{self.file}:{self.line} in {self.function}{code}"


def _is_user(filename: str) -> bool:
    path = os.path.abspath(filename)
    return not (path.startswith(_OURS + os.sep) or path.startswith(_LIBS) or "-packages" + os.sep in path
                or filename.startswith("<frozen"))


def _site(frame, lineno: int) -> Site:
    import linecache

    code = frame.f_code
    return Site(code.co_filename, lineno, code.co_name, linecache.getline(code.co_filename, lineno).strip())


def user_site(tb=None) -> Site | None:
    """The innermost frame of user code in traceback `tb` (default: the current stack, innermost first)."""
    if tb is not None:
        found = None
        while tb is not None:
            if _is_user(tb.tb_frame.f_code.co_filename):
                found = _site(tb.tb_frame, tb.tb_lineno)
            tb = tb.tb_next
        return found
    frame = sys._getframe(1)
    while frame is not None and not _is_user(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else _site(frame, frame.f_lineno)


def locate(error: BaseException, site: Site | None, tile, kernel: str) -> BaseException:
    """`error` with where it happened added (attributes and a note); returns it."""
    blame = getattr(error, "blame", None)  # the tile at fault, when not the one that raised
    error.kernel_site, error.tile = site, blame or tile
    core = getattr(error, "core", None)
    error.core = core
    at = f" at {site}" if site else ""
    on = f"{error.tile}" + (f", core {core}" if core is not None else "")
    if blame is not None and blame != tile:
        on += f"; seen on {tile}, which waited for it"
    note = f"raised in kernel {kernel!r}{at} (on {on})"
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error


class KernelFailed(Exception):
    """A kernel's exception on its way from a tile to the host, with its site, its tile and its output."""

    def __init__(self, error: BaseException, site: Site | None, tile, kernel: str, output: str = ""):
        super().__init__(f"{tile}: {type(error).__name__}: {error}")
        self.error, self.site, self.tile, self.kernel, self.output = error, site, tile, kernel, output

    def __reduce__(self):
        return _rebuild, (self.error, dict(vars(self.error)), self.site, self.tile, self.kernel, self.output)

    def unwrap(self) -> BaseException:
        """The kernel's own exception, located (see :func:`locate`)."""
        return locate(self.error, self.site, self.tile, self.kernel)


def _rebuild(error, attrs, site, tile, kernel, output) -> KernelFailed:
    for k, v in attrs.items():
        if k != "__notes__":
            try:
                setattr(error, k, v)
            except AttributeError:  # a read-only attribute: it came back with the error itself
                pass
    return KernelFailed(error, site, tile, kernel, output)


class TileOutput(io.TextIOBase):
    """``sys.stdout`` (and ``sys.stderr``) while kernels run: what a thread that :meth:`capture` s writes goes to its
    buffer."""

    _lock = threading.Lock()
    _installed: TileOutput | None = None

    def __init__(self, through):
        self.through, self.buffers = through, {}

    def write(self, text: str) -> int:
        buf = self.buffers.get(threading.get_ident())
        return buf.write(text) if buf is not None else self.through.write(text)

    def flush(self) -> None:
        self.through.flush()

    def fileno(self) -> int:  # what it stands in for, to whoever asks (faulthandler, subprocess, a tty check)
        return self.through.fileno()

    def isatty(self) -> bool:
        try:
            return self.through.isatty()
        except ValueError:  # what it stood in for was closed (a test's capture), and someone kept this one
            return False

    @property
    def encoding(self) -> str:
        return getattr(self.through, "encoding", "utf-8")

    @classmethod
    @contextmanager
    def capture(cls):
        """Inside: what this thread prints, to ``sys.stdout`` or ``sys.stderr``, is kept (in the order written);
        yields a function that returns it so far."""
        with cls._lock:
            if not isinstance(sys.stdout, TileOutput):
                sys.stdout = TileOutput(sys.stdout)
            if not isinstance(sys.stderr, TileOutput):
                sys.stderr = TileOutput(sys.stderr)
            streams = (sys.stdout, sys.stderr)
        buf = io.StringIO()
        for out in streams:
            out.buffers[threading.get_ident()] = buf
        try:
            yield buf.getvalue
        finally:
            for out in streams:
                out.buffers.pop(threading.get_ident(), None)
