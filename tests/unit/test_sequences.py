"""B sequences on a square (waferrt.kernels.sequences, core.train_cost.square_tokens), by hand: each sequence cut in
`side` slices, core row i holding every sequence's slice i; a core's heads' blocks folded to B times the heads
with sequence b's head h at b*H + h, and back. The mesh kernels over these are tied in test_train_ties.py and
test_block_backward.py."""

from __future__ import annotations

import numpy as np
import pytest

from waferrt.core.train_cost import TrainShape, square_tokens
from waferrt.kernels.sequences import deinterleave, fold, interleave, unfold


def test_the_rows_of_three_sequences_of_five_on_a_square_of_four():
    shape = TrainShape(3, 5)  # slices of cdiv(5, 4) = 2 tokens, the last of each sequence padded
    assert square_tokens(shape, 4) == 24 and square_tokens(TrainShape(1, 8), 8) == 8
    tokens = np.arange(1, 16)  # sequence b's token t is 5 b + t + 1; 0 is padding
    rows = interleave(tokens[:, None], shape, 4)[:, 0]
    assert rows.tolist() == [1, 2, 6, 7, 11, 12,  # core row 0: each sequence's tokens 0 and 1
                             3, 4, 8, 9, 13, 14,  # row 1: tokens 2 and 3
                             5, 0, 10, 0, 15, 0,  # row 2: token 4 and padding
                             0, 0, 0, 0, 0, 0]  # row 3: padding
    assert deinterleave(rows[:, None], shape, 4)[:, 0].tolist() == tokens.tolist()
    with pytest.raises(ValueError, match="not 3 sequences of 5"):
        interleave(tokens[:14, None], shape, 4)


def test_a_fold_puts_sequence_bs_head_h_at_b_times_heads_plus_h():
    blocks = np.arange(2 * 2 * 3 * 4 * 5).reshape(2, 2, 3, 4, 5)  # 3 heads, 2 sequences of 2 rows a core
    folded = fold(blocks, 2)
    assert folded.shape == (2, 2, 6, 2, 5)
    for b in range(2):
        for h in range(3):
            np.testing.assert_array_equal(folded[:, :, b * 3 + h], blocks[:, :, h, 2 * b:2 * b + 2])
    np.testing.assert_array_equal(unfold(folded, 2), blocks)
    np.testing.assert_array_equal(fold(blocks, 1), blocks)  # one sequence: the blocks as they are
