"""The documentation teaches by examples that run: every python block of README.md and docs/*.md runs here
(pages that open a Ray wafer run in tests/runtime/test_docs_ray.py); the pytest files they show pass with the
plugin; every public member of the kernel context is in the kernel reference."""

from __future__ import annotations

import pytest
from docblocks import PAGES, ROOT, label, needs_ray, pytest_files, run_page, scripts

import waferrt

pytest_plugins = ["pytester"]

LOCAL = [p for p in PAGES if scripts(p) and not needs_ray(p)]


def test_the_pages_with_code_are_found():
    names = {label(p) for p in PAGES if scripts(p)}
    assert {"docs/PROGRAMMING.md", "docs/tutorial.md"} <= names


@pytest.mark.parametrize("page", LOCAL, ids=label)
def test_a_page_runs(page, capsys):
    run_page(page)
    assert capsys.readouterr().out  # each page's examples print what they cost or computed


@pytest.mark.parametrize("page", [p for p in PAGES if pytest_files(p)], ids=label)
def test_the_pytest_files_of_a_page_pass_without_ray(page, pytester):
    files = pytest_files(page)
    for code in files:
        name = code.splitlines()[0].removeprefix("# ").removesuffix(".py").strip()
        pytester.makepyfile(**{name: code})
    result = pytester.runpytest_inprocess("--wafer-backend", "local", "-p", "no:cacheprovider")
    assert result.ret == 0 and result.parseoutcomes()["passed"] >= len(files)


def test_every_public_member_of_the_context_is_in_the_reference():
    text = (ROOT / "docs" / "PROGRAMMING.md").read_text()
    public = [n for n in dir(waferrt.Context) if not n.startswith("_") and n not in ("x", "y")]
    missing = [n for n in public if f"ctx.{n}" not in text]
    assert missing == [], f"docs/PROGRAMMING.md does not describe ctx.{missing}"


def test_the_api_reference_covers_the_public_api():
    text = (ROOT / "docs" / "reference.md").read_text()
    missing = [n for n in waferrt.__all__ if not any(line.startswith(":::") and line.rstrip().endswith(f".{n}")
                                                     for line in text.splitlines())]
    assert missing == [], f"docs/reference.md has no ::: entry for waferrt.{missing}"
