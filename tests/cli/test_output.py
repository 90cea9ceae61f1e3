"""Tables off a terminal: one row per entry, within 80 columns, no cell cut."""

from __future__ import annotations

import io

from rich.console import Console

from lightning_srifty.cli.output import print_rows, row_lines

COLUMNS = ("layer", "type", "forward", "backward", "params")
ROWS = [
    ("model.transformer.decoder.layers.0.multihead_attn", "MultiheadAttention", "3.985 ms",
     "8.267 ms", "628.1 KiB"),
    ("head", "Linear", "0.1 ms", "0.2 ms", "5.0 KiB"),
]  # fmt: skip


def test_rows_become_lines_that_fit_and_keep_every_cell_whole() -> None:
    lines = row_lines("Top layers", COLUMNS, ROWS)
    assert lines[0] == "Top layers:"
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    for row in ROWS:
        assert row[0] in text
        for name, value in zip(COLUMNS[1:], row[1:], strict=True):
            assert f"{name} {value}" in text  # a pair is never split over two lines
    assert "…" not in text


def test_a_terminal_still_gets_a_table() -> None:
    screen = io.StringIO()
    print_rows(Console(file=screen, force_terminal=True, width=200), "Top layers", COLUMNS, ROWS)
    drawn = screen.getvalue()
    assert "┏" in drawn and "layer" in drawn and ROWS[0][0] in drawn
    piped = io.StringIO()
    print_rows(Console(file=piped, width=80), "Top layers", COLUMNS, ROWS)
    assert piped.getvalue().splitlines() == row_lines("Top layers", COLUMNS, ROWS)
