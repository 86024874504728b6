"""README.md's table of summary.json's fields is the one rendered from `SUMMARY_MEANINGS` in core/records.py,
and every field it names is one of StrategySummary's."""

from __future__ import annotations

import importlib.util
from dataclasses import fields
from pathlib import Path

from specbench.core.records import SUMMARY_MEANINGS, StrategySummary

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("render_readme_fields", REPO / "scripts" / "render_readme_fields.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_readme_field_table_is_the_rendered_one():
    readme = (REPO / "README.md").read_text()
    assert load_script().with_fields_table(readme) == readme, (
        "README.md's field table differs from SUMMARY_MEANINGS in specbench/core/records.py: "
        "run `python scripts/render_readme_fields.py`")


def test_every_field_with_a_meaning_is_a_summary_field():
    named = [name for names in SUMMARY_MEANINGS for name in names]
    assert set(named) <= {f.name for f in fields(StrategySummary)}
    assert len(named) == len(set(named))
