"""Integer arithmetic shared by every floor: one ceiling division instead of ``-(-a // b)`` written inline,
one check that a count given by a user is a whole number in range, and the one bisection
(:func:`first_true` / :func:`last_true`: every "the most that fits" and "the fewest that fit" search).

Contract: pure functions on Python or numpy integers. :func:`whole` returns the value as an ``int`` or
raises ``TypeError`` (not an integer: a float, a string, a bool) or ``ValueError`` (below its least
value), either naming what the value was for, the value, and what is allowed.
"""

from __future__ import annotations

import operator


def cdiv(a, b):
    """Ceiling of a / b for integers (b > 0): how many chunks of b hold a items."""
    return -(-a // b)


def first_true(lo: int, hi: int, pred) -> int | None:
    """The smallest v in [lo, hi] with pred(v), for a pred that is monotone (False...False True...True);
    None when pred(hi) is False.

    >>> first_true(1, 100, lambda v: v * v >= 50)
    8
    """
    if lo > hi or not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pred(mid) else (mid + 1, hi)
    return lo


def last_true(lo: int, hi: int, pred) -> int | None:
    """The largest v in [lo, hi] with pred(v), for a pred that is monotone (True...True False...False);
    None when pred(lo) is False.

    >>> last_true(1, 100, lambda v: v * v <= 50)
    7
    """
    if lo > hi or not pred(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if pred(mid) else (lo, mid - 1)
    return lo


def whole(what: str, value, least: int | None = 1) -> int:
    """`value` as an int when it is an integer (Python or numpy; not a bool, not 2.0) >= `least` (None: any).

    >>> whole("tokens", 8)
    8
    >>> whole("tokens", -2)
    Traceback (most recent call last):
    ValueError: tokens must be at least 1, got -2
    """
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be a whole number (an int), got {value!r} of type {type(value).__name__}")
    n = operator.index(value)
    if least is not None and n < least:
        raise ValueError(f"{what} must be at least {least}, got {n}")
    return n
