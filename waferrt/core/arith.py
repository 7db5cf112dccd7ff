"""Integer arithmetic shared by every floor: one ceiling division instead of ``-(-a // b)`` written inline,
and one check that a count given by a user is a whole number in range.

Contract: pure functions on Python or numpy integers. :func:`whole` returns the value as an ``int`` or
raises ``TypeError`` (not an integer: a float, a string, a bool) or ``ValueError`` (below its least
value), either naming what the value was for, the value, and what is allowed.
"""

from __future__ import annotations

import operator


def cdiv(a, b):
    """Ceiling of a / b for integers (b > 0): how many chunks of b hold a items."""
    return -(-a // b)


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
