"""Render what is declared once in specbench/core/records/metrics.py (`METRICS`): README.md's table of
summary.json's fields, rewritten between the README's `fields` markers, and summary.json's JSON schema,
docs/summary.schema.json:

    python scripts/render_readme_fields.py

tests/test_readme_fields.py fails while either differs from the rendered one.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbench.core.records.metrics import METRICS
from specbench.core.records.schema import summary_schema

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCHEMA = ROOT / "docs" / "summary.schema.json"
START, END = "<!-- fields: start -->", "<!-- fields: end -->"


def fields_table() -> str:
    """The Markdown table: a row per metric with a meaning, its fields, unit and meaning."""
    # written as the README's other tables are: core.markdown's separator line spans each column's widest cell
    lines = ["| field | unit | meaning |", "| --- | --- | --- |"]
    for metric in METRICS:
        if metric.meaning:
            cell = ", ".join(f"`{name}`" for name in metric.fields)
            lines.append(f"| {cell} | {metric.unit} | " + metric.meaning.replace("|", r"\|") + " |")
    return "\n".join(lines)


def with_fields_table(readme: str) -> str:
    """The README's text with the table between its markers rendered anew."""
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the markers {START} and {END} around its field table")
    before, rest = readme.split(START)
    after = rest.split(END)[1]
    return f"{before}{START}\n\n{fields_table()}\n\n{END}{after}"


def schema_text() -> str:
    return json.dumps(summary_schema(), indent=2) + "\n"


def main() -> None:
    README.write_text(with_fields_table(README.read_text()))
    SCHEMA.write_text(schema_text())


if __name__ == "__main__":
    main()
