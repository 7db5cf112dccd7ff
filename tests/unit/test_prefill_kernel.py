"""WaferLLM's prefill on the setup its published kernel is timed on (waferrt.estimator.prefill.kernel_prefill):
one layer's weights resident on the grid, the prompt in one piece, no decode beside it (no Ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.prefill import prefill_work_parts
from waferrt.estimator.estimate import paper_decoding
from waferrt.estimator.prefill import LLAMA3_8B, kernel_lines, kernel_prefill


def test_one_layer_and_the_prompt_fit_a_core_worked_out_by_hand():
    """Llama3-8B's layer: 4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x 14336 = 218,103,808 weights; the
    prompt's activations 4096 x (2 x 4096 + 2 x 1024 + 2 x 14336 + 4096) = 176,160,768 values. On 127 x 127 =
    16,129 cores a core holds ceil(.../16,129) = 13,523 + 10,922 float16 values = 48,890 bytes <= 48 KB (49,152);
    on 126 x 126 = 15,876 cores, 13,738 + 11,096 = 49,668 bytes: no fit."""
    assert kernel_prefill(LLAMA3_8B, WSE2, 127, 4096, "float16") is not None
    assert kernel_prefill(LLAMA3_8B, WSE2, 126, 4096, "float16") is None
    assert "cannot hold" in kernel_lines(LLAMA3_8B, WSE2, 126, 4096, "float16")[0]


def test_every_layer_is_the_grids_closed_forms():
    parts = kernel_prefill(LLAMA3_8B, WSE2, 480, 4096, "float16")
    one = sum(c.seconds(WSE2) for _, _, c in prefill_work_parts(
        WSE2, paper_decoding(LLAMA3_8B, "float16", 1), Region(0, 0, 480, 480), 4096))
    assert sum(parts.values()) == pytest.approx(32 * one) and parts["layout"] == 0


def test_estimate_prints_the_kernel_setup_where_the_decode_does_not_fit():
    """`--mesh 480x480` holds no Llama3-8B decode (16.6 GB of 11.3), yet WaferLLM timed its prefill there: the
    command prints the kernel setup's figure and why it lies above the measured range."""
    out = subprocess.run([sys.executable, "-m", "waferrt.cli", "estimate", "--model", "llama3-8b", "--requests", "1",
                          "--prompt-tokens", "4096", "--mesh", "480x480"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "DOES NOT FIT" in out.stdout
    assert "vs its kernel" in out.stdout and "480x480 cores" in out.stdout and "why above" in out.stdout
