"""What the CLI reads is taken as the user wrote it: a prompt file's UTF-8 byte-order mark is no part of its
first prompt, and a sweep's SRAM values label its rows as given (48 and 48.9 KB are two designs, not two 48s)."""

from __future__ import annotations

import json

from waferrt.cli import main
from waferrt.cli.common import prompt_file
from waferrt.estimator.sweep import sram_kb


def test_a_byte_order_mark_is_not_read_as_part_of_the_first_prompt(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_bytes("\ufeffThe capital of France is\r\nWater boils at\n".encode())
    assert prompt_file(str(f)) == ("The capital of France is", "Water boils at")


def test_sram_labels_keep_the_kb_given():
    assert sram_kb(48 * 1024) == 48 and isinstance(sram_kb(48 * 1024), int)
    assert sram_kb(int(48.9 * 1024)) == 48.9  # 50,073 bytes: 48.899 KB, shown to two decimals
    assert sram_kb(int(0.5 * 1024)) == 0.5


def test_a_training_sweep_names_each_sram_as_given_and_the_faster_best(capsys, tmp_path):
    assert main(["sweep", "--train", "--model", "smollm2-135m", "--dies", "1x1", "--sram", "48,48.9", "--flops", "8",
                 "--d2d", "1", "--topology", "mesh", "--json", "--png", str(tmp_path / "t.png")]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["designs"]
    assert [r["sram_kb"] for r in rows] == [48, 48.9], rows
    for strategy, best in doc["best"].items():
        fastest = max(rows, key=lambda r: r[strategy]["tokens_per_s"])
        assert best["sram_kb"] == fastest["sram_kb"], (strategy, best, rows)
