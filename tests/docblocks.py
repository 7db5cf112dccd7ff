"""The code blocks of the documentation (README.md and every page under docs/), for the tests that run them.

Every ```python block runs: a page's blocks in order, in one namespace (a page is a story: later blocks use
what earlier ones defined). A block whose first line is ``# test_<name>.py`` is a pytest file, run by
pytester instead. A page any of whose blocks opens a Ray wafer (``backend="ray"``, ``WaferLLM(``) runs in the runtime
tier (tests/runtime/test_docs_ray.py), the rest in the unit tier (tests/unit/test_docs.py)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: pathlib.Path) -> list[str]:
    """The page's python blocks, in order."""
    return _BLOCK.findall(page.read_text())


def scripts(page: pathlib.Path) -> list[str]:
    return [b for b in blocks(page) if not b.startswith("# test_")]


def pytest_files(page: pathlib.Path) -> list[str]:
    return [b for b in blocks(page) if b.startswith("# test_")]


RAY_WORDS = ('backend="ray"', "WaferLLM(")  # a Ray wafer, or the LLM on tile actors


def needs_ray(page: pathlib.Path) -> bool:
    return any(word in b for b in scripts(page) for word in RAY_WORDS)


def run_page(page: pathlib.Path) -> dict:
    """Runs the page's scripts in order in one namespace (each block's frames named page:block N, so a
    failure points at the block); returns the namespace."""
    namespace = {"__name__": "__doc_example__"}
    for i, code in enumerate(scripts(page)):
        exec(compile(code, f"{page.relative_to(ROOT)}: python block {i + 1}", "exec"), namespace)
    return namespace


def label(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))
