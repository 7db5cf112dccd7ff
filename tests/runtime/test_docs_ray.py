"""The documentation pages whose examples open a Ray wafer (the tutorial's last step, ...) run here, on the
session's local Ray, every python block in order (tests/docblocks.py)."""

from __future__ import annotations

import pytest
from docblocks import PAGES, label, needs_ray, run_page


@pytest.mark.parametrize("page", [p for p in PAGES if needs_ray(p)], ids=label)
def test_a_page_runs_on_ray(page, ray_session, capsys):
    run_page(page)
    assert capsys.readouterr().out
