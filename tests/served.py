"""A live ``waferrt serve`` for tests (tests/ is on sys.path: ``from served import serving, tiny_model, TINY``).

Contract: ``serving(argv)`` is waferrt.testing.served's, a server that does not start failing the test with its
stderr; ``tiny_model(folder)`` writes the tests' tiny llama GGUF (a byte vocabulary) and returns its path;
``TINY`` is the placement flags that fit it on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from waferrt.testing import served

TINY = ["--spec", "tiny", "--mesh", "16x16", "--tile", "8x8", "--kv-tokens", "64", "--requests", "4"]


def tiny_model(folder) -> str:
    from ggufs import Vocab, write_gguf

    from waferrt.model import synthetic_llama, tiny_config

    path = folder / "tiny.gguf"
    config = dataclasses.replace(tiny_config(), vocab_size=264)  # the 256 bytes, "Ġt", unused ones
    write_gguf(path, config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    return str(path)


@contextlib.contextmanager
def serving(argv: list[str], deadline_s: float = 180.0):
    try:
        with served.serving(argv, deadline_s) as srv:
            yield srv
    except served.ServerDidNotStart as e:
        pytest.fail(str(e))
