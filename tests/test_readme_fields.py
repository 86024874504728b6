"""README.md's table of summary.json's fields and docs/summary.schema.json are the ones rendered from `METRICS`
in core/records/metrics.py, and every field a metric names is one of StrategySummary's."""

from __future__ import annotations

import importlib.util
from dataclasses import fields
from pathlib import Path

from specbench.core.records import COLUMN_SPECS, METRICS, StrategySummary

REPO = Path(__file__).resolve().parents[1]
RUN_IT = "run `python scripts/render_readme_fields.py`"


def load_script():
    spec = importlib.util.spec_from_file_location("render_readme_fields", REPO / "scripts" / "render_readme_fields.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_readme_field_table_is_the_rendered_one():
    readme = (REPO / "README.md").read_text()
    assert load_script().with_fields_table(readme) == readme, (
        f"README.md's field table differs from METRICS in specbench/core/records/metrics.py: {RUN_IT}")


def test_the_summary_schema_is_the_rendered_one():
    assert (REPO / "docs" / "summary.schema.json").read_text() == load_script().schema_text(), (
        f"docs/summary.schema.json differs from the records and METRICS: {RUN_IT}")


def test_every_metric_is_declared_once_over_summary_fields():
    named = [name for metric in METRICS for name in metric.fields]
    assert set(named) <= {f.name for f in fields(StrategySummary)}
    assert len(named) == len(set(named))
    columns = [name for metric in METRICS for name in metric.columns]
    assert len(columns) == len(set(columns)) == len(COLUMN_SPECS)
