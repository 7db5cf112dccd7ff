"""Files the CLI writes are written whole or not at all (waferrt.core.files): a Ctrl-C or a full disk keeps the
file that was there, leaves no temporary behind, and the command says so in one line, exit status 2. (That an
output path which is a device or a FIFO is refused while parsing: tests/unit/test_bad_input_*.py.)"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import pytest

from waferrt.core.files import WriteError, atomic_open, atomic_path


def test_an_interrupted_write_keeps_the_old_file(tmp_path):
    out = tmp_path / "weights.gguf"
    out.write_bytes(b"the good weights")
    with pytest.raises(KeyboardInterrupt), atomic_path(out) as tmp:
        tmp.write_bytes(b"half of the n")
        raise KeyboardInterrupt
    assert out.read_bytes() == b"the good weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.gguf"]


def test_a_finished_write_replaces_the_file_and_keeps_its_mode(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("old")
    out.chmod(0o640)
    with atomic_open(out) as f:
        f.write("new")
    assert out.read_text() == "new" and (out.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_fifo_is_refused_not_opened(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    with pytest.raises(WriteError, match="is not a regular file"), atomic_open(fifo) as f:
        f.write("would block without a reader")


def _small_files():
    """In the child: files may grow to 64 KB (a write past it fails: EFBIG, as a full disk fails: ENOSPC)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def test_a_full_disk_on_train_save_keeps_the_trained_file_that_was_there(tmp_path):
    out = tmp_path / "trained.gguf"
    out.write_bytes(b"last night's weights")
    proc = subprocess.run([sys.executable, "-m", "waferrt.cli", "train", "--model", "tiny", "--steps", "1",
                           "--save", str(out)], capture_output=True, text=True, timeout=300,
                          preexec_fn=_small_files, env={**os.environ, "WAFERRT_CACHE": str(tmp_path / "cache")})
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("[waferrt ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"waferrt train: cannot write {out}: "), proc.stderr[-3000:]
    assert lines[0].endswith("(the file that was there is kept); free some space or give a path you can write to")
    assert out.read_bytes() == b"last night's weights"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["trained.gguf"]
