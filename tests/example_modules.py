"""The examples (examples/*.py) as modules, for tests that call their ``main(backend)``. (tests/ is on
sys.path: ``from example_modules import example``.)"""

from __future__ import annotations

import importlib
import pathlib
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def example(name: str):
    """The module of examples/<name>.py."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))
