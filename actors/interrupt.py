"""Ctrl-C while the host submits calls to its tiles and waits on them, kept so that it cannot be lost.

Contract: ``with interruptible():`` (in the driver's main thread, with Python's own SIGINT handler in place)
makes a SIGINT also set a flag before Python raises KeyboardInterrupt as usual; the waits inside call
:func:`check_interrupt` between their slices, which raises KeyboardInterrupt once when the flag is set. Code
that runs during a submission or a wait (Ray's) can swallow the KeyboardInterrupt Python raised: a driver in
``Wafer.run`` then ran on for good after Ctrl-C (1 run in ~30 under load; its stacks showed it still waiting
221 s later). The flag is not lost with it. Elsewhere (another thread, a program with a SIGINT handler of its
own, a block inside a block) nothing changes, and :func:`check_interrupt` does nothing."""

from __future__ import annotations

import contextlib
import signal
import threading

_hit: threading.Event | None = None  # set by a SIGINT while an interruptible() block runs


@contextlib.contextmanager
def interruptible():
    global _hit
    if (_hit is not None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    hit = threading.Event()

    def on_sigint(signum, frame):
        hit.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    _hit = hit
    try:
        yield
    finally:
        _hit = None
        signal.signal(signal.SIGINT, signal.default_int_handler)


def check_interrupt() -> None:
    """KeyboardInterrupt if a Ctrl-C came during the current interruptible() block and was not raised yet (in the
    main thread: the one the block runs in)."""
    if _hit is not None and _hit.is_set() and threading.current_thread() is threading.main_thread():
        _hit.clear()
        raise KeyboardInterrupt("Ctrl-C while the host waited on its tiles")
