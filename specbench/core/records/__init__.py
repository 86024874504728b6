"""The typed records specbench writes and reads back, one module per what they record: run.py (a run's rows,
summaries and what it noted), study.py (a tune study), serve.py (a serve run's records, imported from there),
metrics.py (each figure's meaning, unit and columns, declared once), all written and read by serialise.py;
schema.py gives summary.json's JSON schema."""

from specbench.core.records.metrics import COLUMN_SPECS, METRICS, SUMMARY_MEANINGS, Column, Metric
from specbench.core.records.run_records import (
    ROW_KEYS,
    SUMMARY_KEYS,
    EnginePair,
    EngineReport,
    LoadAxis,
    LoadPoint,
    ModelledSpeedup,
    Noise,
    Projection,
    Row,
    RunProjection,
    RunResult,
    StrategySummary,
    SummaryFile,
    rows_frame,
)
from specbench.core.records.study_records import ServedStudy, StudyRecord, TunedStudy

__all__ = ["COLUMN_SPECS", "METRICS", "ROW_KEYS", "SUMMARY_KEYS", "SUMMARY_MEANINGS", "Column", "EnginePair",
           "EngineReport", "LoadAxis", "LoadPoint", "Metric", "ModelledSpeedup", "Noise", "Projection", "Row",
           "RunProjection", "RunResult", "ServedStudy", "StrategySummary", "StudyRecord", "SummaryFile", "TunedStudy",
           "rows_frame"]
