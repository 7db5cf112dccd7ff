"""Fixtures of the bad-command-line tests (tests/unit/test_bad_input_*.py, helpers in tests/badcli.py):
``cli_files`` the model files, prompt files and fault plans their cases name (made once a session), ``not_ray``
a loopback address that answers like a web server, not like Ray's GCS."""

from __future__ import annotations

import pytest
from badcli import make_files
from loopback import answering


@pytest.fixture(scope="session")
def cli_files(tmp_path_factory) -> dict[str, str]:
    return make_files(tmp_path_factory.mktemp("bad-input"))


@pytest.fixture(scope="session")
def not_ray():
    with answering(b"HTTP/1.1 400 Bad Request\r\n\r\n") as address:
        yield address
