"""Tables that stay readable where there is no terminal (CI, log files, pipes).

On a terminal rich draws a table as wide as the screen. Elsewhere rich assumes 80
columns and cuts every cell that does not fit ("model.tr…", "$5.6…"); there each row
becomes a line of its own instead: the row's name, then ``column value`` pairs wrapped
at 80 columns. Nothing is cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

WIDTH = 80


def row_lines(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int = WIDTH
) -> list[str]:
    """``title:``, then per row its first cell and the other cells as ``column value``.

    A ``column value`` pair is never split across lines; lines after a row's first are
    indented further.
    """
    lines = [f"{title}:"]
    for row in rows:
        head, *rest = row
        pieces = [f"{name} {value}" for name, value in zip(columns[1:], rest, strict=True)]
        line = f"  {head}:" if pieces else f"  {head}"
        for i, piece in enumerate(pieces):
            piece += "," if i < len(pieces) - 1 else ""
            if len(line) + 1 + len(piece) > width and line.strip():
                lines.append(line)
                line = "      " + piece
            else:
                line += " " + piece
        lines.append(line)
    return lines


def print_rows(
    console: Any,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Sequence[str] = (),
) -> None:
    """A rich table on a terminal, :func:`row_lines` anywhere else.

    Args:
        console: A ``rich.console.Console``.
        title: The table's title.
        columns: Column names; the first names each row.
        rows: Cells, as text.
        right: Columns to right-align in the table.
    """
    if not console.is_terminal:
        for line in row_lines(title, columns, rows):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(title=title)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
