"""Integer arithmetic shared by every floor: one ceiling division instead of ``-(-a // b)`` written inline.

Contract: pure functions on Python or numpy integers.
"""

from __future__ import annotations


def cdiv(a, b):
    """Ceiling of a / b for integers (b > 0): how many chunks of b hold a items."""
    return -(-a // b)
