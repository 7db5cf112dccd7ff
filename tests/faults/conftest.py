"""The fault tests' shared fixtures: one WaferLLM per module on the module's PLACEMENT of its CFG and WEIGHTS,
and the numpy reference's tokens for its REQUESTS and SAMPLER (a module with another set-up defines its own)."""

from __future__ import annotations

import pytest

from waferrt.llm import WaferLLM
from waferrt.serving import generate_reference


@pytest.fixture(scope="module")
def llm(ray_session, request):
    m = request.module
    with WaferLLM(m.CFG, m.WEIGHTS, m.PLACEMENT) as llm:
        yield llm


@pytest.fixture(scope="module")
def want(request):
    m = request.module
    return [c.tokens for c in generate_reference(m.CFG, m.WEIGHTS, m.REQUESTS, m.SAMPLER)[0]]
