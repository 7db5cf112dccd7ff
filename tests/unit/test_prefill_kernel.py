"""WaferLLM's prefill on the setup its published kernel is timed on (waferrt.estimator.prefill.kernel_prefill):
one layer's weights resident on the grid, the prompt in one piece, no decode beside it; the vector instructions
its MeshGEMM loops issue and what each would have to cost for the model to land in the measured range (no Ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.prefill import prefill_work_parts
from waferrt.estimator.estimate import paper_decoding
from waferrt.estimator.prefill import LLAMA3_8B, break_even_cycles, kernel_instructions, kernel_lines, kernel_prefill


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
    assert "622,080 vector instructions" in out.stdout and "2.3-5.3 cycles" in out.stdout


def test_the_kernels_vector_instructions_worked_out_by_hand():
    """Llama3-8B, 4096 tokens on 720x720: Kt and Nt are ceil(4096 / 720) = 6 and ceil(14336 / 720) = 20. A step
    issues Kt x Nt fmach: xq, xk, xv, h1 (4096, 4096) 36 each, score and output 36 each, z1, z2 (4096, 14336)
    120 each, h2 120: 144 + 72 + 240 + 120 = 576 a step, x 720 steps = 414,720 a layer."""
    assert kernel_instructions(LLAMA3_8B, 720, 4096) == 414_720


def test_the_break_even_cost_of_an_instruction_worked_out_by_hand():
    """4096 tokens modelled in 0.1 s, to run at 20,000 tokens/s (0.2048 s): 0.1048 s x 1.1 GHz = 115,280,000
    cycles over 1,000,000 instructions = 115.28 cycles each; a model slower than the rate already needs < 0."""
    assert break_even_cycles(WSE2, 0.1, 20_000, 4096, 1_000_000) == pytest.approx(115.28)
    assert break_even_cycles(WSE2, 0.3, 20_000, 4096, 1_000_000) < 0
