"""Progress on stderr: tqdm bars on a terminal, plain lines elsewhere, nothing per token unless asked.

Contract: :func:`counter` shows "desc: i/n unit" -- a bar that fills on a terminal (closed, and left on
screen, at n/n), and only the n/n line when stderr is not a terminal (a log, a pipe, CI). :func:`line`
prints a line without breaking a bar that is being drawn. :func:`waiting` shows a bar with the elapsed
time while a thread runs (the model's weights loading in the background: dequantising a GGUF on a first
run, mapping the cache after). :class:`DecodeBar` counts the generated tokens, with tokens/s, on a
terminal; with ``verbose`` it also prints one line per token (everywhere); otherwise, off a terminal, it
prints nothing per token. Whether stderr is a terminal is asked at each call (tests swap stderr).
"""

from __future__ import annotations

import sys
import threading

_BARS: dict[str, object] = {}  # desc -> its open tqdm bar


def _tty() -> bool:
    return sys.stderr.isatty()


def line(text: str, out=None) -> None:
    """One line on stderr, or on `out` (e.g. sys.stdout: a result), above any bar being drawn."""
    out = out or sys.stderr
    if _BARS:
        from tqdm import tqdm

        tqdm.write(text, file=out)
    else:
        print(text, file=out, flush=True)


def counter(desc: str, i: int, n: int, unit: str, stamp: str) -> None:
    """Step i of n of `desc`: a bar on a terminal, else only the last step's line."""
    if not _tty():
        if i == n:
            line(f"{stamp} {desc}: {n}/{n} {unit}".rstrip())
        return
    from tqdm import tqdm

    bar = _BARS.get(desc)
    if bar is None:
        bar = _BARS[desc] = tqdm(total=n, desc=f"{stamp} {desc}", unit=f" {unit}" if unit else "it",
                                 file=sys.stderr, leave=True, dynamic_ncols=True)
    bar.update(i - bar.n)
    if i >= n:
        bar.close()
        del _BARS[desc]


def waiting(desc: str, thread: threading.Thread, stamp: str) -> None:
    """Wait for `thread`, with a bar that shows the time it takes on a terminal (nothing elsewhere)."""
    if not _tty() or not thread.is_alive():
        thread.join()
        return
    from tqdm import tqdm

    with tqdm(desc=f"{stamp} {desc}", bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False) as bar:
        while thread.is_alive():
            thread.join(0.2)
            bar.refresh()


class DecodeBar:
    """The tokens as they come: a bar with tokens/s on a terminal, a line per token with `verbose`."""

    def __init__(self, total: int, verbose: bool, stamp, show_bar: bool = True):
        self.verbose, self.stamp, self.n = verbose, stamp, 0
        self.bar = None
        if show_bar and _tty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=f"{stamp()} decoding", unit=" tok", file=sys.stderr, leave=False,
                            dynamic_ncols=True)
            _BARS["decoding"] = self.bar

    def token(self, request: int, token: int, finish: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.update(1)
        if self.verbose:
            end = f" ({finish})" if finish else ""
            line(f"{self.stamp()} request {request}: token {token}{end}, {self.n} in all")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            _BARS.pop("decoding", None)
            self.bar = None
