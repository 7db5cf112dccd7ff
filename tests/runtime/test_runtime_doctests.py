"""The examples in the docstrings of the Ray-backed APIs (Wafer, DSM.alloc) run on the session's Ray."""

from __future__ import annotations

import doctest

import waferrt.runtime


def test_wafer_and_dsm_docstring_examples(ray_session):
    result = doctest.testmod(waferrt.runtime, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 2 and result.failed == 0
