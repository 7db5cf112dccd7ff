"""The examples in the docstrings of the main pure APIs run, and print what they say (doctest)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["waferrt.fabric.kernel", "waferrt.fabric.view", "waferrt.scheduler.placement",
                                    "waferrt.core.arith"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
