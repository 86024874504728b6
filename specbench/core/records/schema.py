"""summary.json's JSON schema, from its records' types (pydantic reads the dataclasses) and each figure's
meaning and unit in metrics.py; scripts/render_readme_fields.py writes it to docs/summary.schema.json."""

from __future__ import annotations

from typing import Any

from specbench.core.records.metrics import METRICS
from specbench.core.records.run_records import SummaryFile


def summary_schema() -> dict[str, Any]:
    """The JSON schema of summary.json, each StrategySummary figure described by its meaning and unit."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(SummaryFile).json_schema(mode="serialization")
    schema["title"] = "specbench summary.json"
    properties = schema["$defs"]["StrategySummary"]["properties"]
    for metric in METRICS:
        legends = "; ".join(column.legend for column in metric.columns.values())
        for name in metric.fields:
            properties[name]["description"] = f"{metric.meaning or legends} (unit: {metric.unit})"
    return schema
