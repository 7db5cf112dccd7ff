"""Ctrl-C while the host waits on its tiles is not lost when code run during the wait swallows the
KeyboardInterrupt (actors.interrupt): the wait raises it again at its next slice, once. No Ray: a real SIGINT
to this process, the library that swallows it played by an except clause."""

from __future__ import annotations

import signal

import pytest

from waferrt.actors.interrupt import check_interrupt, interruptible


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test (a pytest-xdist worker may run with another)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_swallowed_during_the_wait_is_raised_at_its_next_check_once(python_sigint):
    with interruptible():
        with pytest.raises(KeyboardInterrupt):  # Python raises it as usual ...
            signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt, match="Ctrl-C while the host waited on its tiles"):
            check_interrupt()  # ... and the wait raises it again, though the first was swallowed
        check_interrupt()  # once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_a_block_or_under_a_handler_of_the_programs_own_nothing_changes(python_sigint):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    check_interrupt()  # no block: nothing kept
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    with interruptible():
        signal.raise_signal(signal.SIGINT)
        check_interrupt()  # the program's handler took it: not a KeyboardInterrupt
    assert seen == [signal.SIGINT]
