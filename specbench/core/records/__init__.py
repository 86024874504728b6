"""The typed records specbench writes and reads back, one module per what they record: run_records.py (a run's
run.json, rows, summaries and what it noted), study_records.py (a tune study), serve_records.py (a serve run's
records, imported from there),
metrics.py (each figure's meaning, unit and columns, declared once), all written and read by serialise.py;
schema.py gives summary.json's JSON schema."""

from specbench.core.records.metrics import COLUMN_SPECS, METRICS, SUMMARY_MEANINGS, Column, Metric
from specbench.core.records.run_records import (
    ROW_KEYS,
    STATUSES,
    SUMMARY_KEYS,
    CostPrediction,
    EngineAgreement,
    EnginePair,
    EngineReport,
    Environment,
    HostFigures,
    LoadAxis,
    LoadPoint,
    ModelledSpeedup,
    Noise,
    NoiseVerdict,
    Outlier,
    Projection,
    Row,
    RunMeta,
    RunProjection,
    RunResult,
    StrategySummary,
    SummaryFile,
    WarmUp,
    rows_frame,
)
from specbench.core.records.study_records import ServedStudy, StudyRecord, TunedStudy

__all__ = ["COLUMN_SPECS", "METRICS", "ROW_KEYS", "STATUSES", "SUMMARY_KEYS", "SUMMARY_MEANINGS", "Column",
           "CostPrediction", "EngineAgreement", "EnginePair", "EngineReport", "Environment", "HostFigures", "LoadAxis",
           "LoadPoint", "Metric", "ModelledSpeedup", "Noise", "NoiseVerdict", "Outlier", "Projection", "Row",
           "rows_frame", "RunMeta", "RunProjection", "RunResult", "ServedStudy", "StrategySummary", "StudyRecord",
           "SummaryFile", "TunedStudy", "WarmUp"]
