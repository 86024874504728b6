"""The one Markdown table renderer: GitHub pipe tables through tabulate, every cell as written.

Cells are not padded to the column width and nothing is parsed as a number, so a cell reads the same in
the table as in the row that made it ("1.50x", "n/a", "0.10")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tabulate import tabulate


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table, without a trailing newline."""
    return tabulate([list(row) for row in rows], list(headers), tablefmt="github", stralign=None, numalign=None,
                    disable_numparse=True)
