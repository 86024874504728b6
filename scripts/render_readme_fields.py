"""Render README.md's table of summary.json's fields from their meanings in specbench/core/records.py
(`SUMMARY_MEANINGS`), rewriting it between the README's `fields` markers:

    python scripts/render_readme_fields.py

tests/test_readme_fields.py fails while the README's table differs from the rendered one.
"""

from __future__ import annotations

from pathlib import Path

from specbench.core.records import SUMMARY_MEANINGS

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- fields: start -->", "<!-- fields: end -->"


def fields_table() -> str:
    """The Markdown table: a row per entry of SUMMARY_MEANINGS, its fields and their meaning."""
    # written as the README's other tables are: core.markdown's separator line spans each column's widest cell
    lines = ["| field | meaning |", "| --- | --- |"]
    for names, meaning in SUMMARY_MEANINGS.items():
        cell = ", ".join(f"`{name}`" for name in names)
        lines.append(f"| {cell} | " + meaning.replace("|", r"\|") + " |")
    return "\n".join(lines)


def with_fields_table(readme: str) -> str:
    """The README's text with the table between its markers rendered anew."""
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the markers {START} and {END} around its field table")
    before, rest = readme.split(START)
    after = rest.split(END)[1]
    return f"{before}{START}\n\n{fields_table()}\n\n{END}{after}"


def main() -> None:
    README.write_text(with_fields_table(README.read_text()))


if __name__ == "__main__":
    main()
