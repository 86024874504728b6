"""Read run directories written by the bench and turn them into comparison tables.

A run directory holds run.json (status, model, suite, strategies), config.json, environment.json,
rows.jsonl (or rows.parquet: one row per strategy, prompt, turn and repeat), summary.json (one
aggregate per strategy, written when the run completes) and optionally nvml_series.csv. An
incomplete run is shown with what it has, aggregated from its rows, and flagged in the warnings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from specbench.errors import SpecbenchError
from specbench.measure.lossless import divergences, mismatch_detail
from specbench.measure.stats import geometric_mean

ROW_KEYS = (
    "strategy", "prompt_id", "category", "turn", "repeat", "prompt_tokens", "new_tokens", "wall_s",
    "ttft_s", "tpot_s", "steps", "tau", "drafted", "accepted",
    "accept_by_position", "draft_s", "verify_s", "other_s", "peak_mem_bytes",
    "mismatch", "first_divergence", "speedup",
)
STATUSES = ("complete", "incomplete")
FORMATS = ("table", "markdown", "csv", "json")
GROUPINGS = ("strategy", "category")
STRATEGY_COLUMNS = (
    "run", "model", "suite", "strategy", "prompts", "new_tokens", "tokens_per_s", "speedup",
    "speedup_ci_low", "speedup_ci_high", "tau", "draft_efficiency", "mismatches", "draft_frac",
    "verify_frac", "other_frac", "peak_mem_gb",
)
"""Columns of comparison(by="strategy"); cost-model, NVML and projection columns follow when present."""
CATEGORY_COLUMNS = (
    "run", "model", "suite", "strategy", "category", "prompts", "new_tokens", "tokens_per_s",
    "speedup", "tau", "draft_efficiency", "mismatches", "peak_mem_gb",
)


@dataclass
class Run:
    """One loaded run directory. `summary` is summary.json's results, None when absent."""

    path: Path
    label: str
    meta: dict[str, Any]
    config: dict[str, Any]
    environment: dict[str, Any]
    rows: pd.DataFrame
    summary: list[dict[str, Any]] | None
    nvml_series: pd.DataFrame | None

    @property
    def complete(self) -> bool:
        return self.meta["status"] == "complete"

    def strategies(self) -> list[str]:
        """Strategies in run order: run.json's list, then any others the rows or summary name."""
        seen = list(self.meta.get("strategies") or [])
        found = list(self.rows["strategy"].unique()) if len(self.rows) else []
        found += [r["strategy"] for r in self.summary or []]
        return seen + [s for s in dict.fromkeys(found) if s not in seen]


# -- loading ---------------------------------------------------------------------------------


def load_runs(dirs: Sequence[Path | str]) -> tuple[list[Run], list[str]]:
    """Load run directories; returns the runs and warnings for the caller to print.

    Not a run directory -> SpecbenchError. An incomplete run loads with what it has (a cut-off
    last line of rows.jsonl is skipped) and adds a warning; so does a greedy mismatch.
    """
    if not dirs:
        raise SpecbenchError("no run directories given")
    paths = [Path(d) for d in dirs]
    names = [p.resolve().name for p in paths]
    runs: list[Run] = []
    warnings: list[str] = []
    for path, name in zip(paths, names, strict=True):
        label = name if names.count(name) == 1 else str(path)
        run = _load_run(path, label, warnings)
        runs.append(run)
        if not run.complete:
            have = f"{len(run.rows)} rows" + (", summary.json" if run.summary is not None else "")
            warnings.append(f"run {path} is incomplete: showing what it has ({have})")
        if len(run.rows):
            bad = run.rows[run.rows["mismatch"].astype(bool)]
            for strategy, rows in bad.groupby("strategy"):
                warnings.append(f"run {path}: strategy {strategy} has {len(rows)} greedy mismatch(es) against ar"
                                + mismatch_detail(*divergences(rows)))
    return runs, warnings


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecbenchError(f"cannot read {what} {path}: {err}") from None


def _load_run(path: Path, label: str, warnings: list[str]) -> Run:
    if not path.is_dir():
        raise SpecbenchError(f"{path} is not a specbench run directory (not a directory)")
    if not (path / "run.json").is_file():
        raise SpecbenchError(f"{path} is not a specbench run directory (no run.json)")
    meta = _read_json(path / "run.json", "run metadata")
    if not isinstance(meta, dict) or meta.get("status") not in STATUSES:
        raise SpecbenchError(f"{path / 'run.json'}: 'status' must be one of {', '.join(STATUSES)}")
    complete = meta["status"] == "complete"

    def optional_dict(name: str) -> dict[str, Any]:
        file = path / name
        if not file.is_file():
            return {}
        data = _read_json(file, name)
        if not isinstance(data, dict):
            raise SpecbenchError(f"{file} must hold a JSON object")
        return data

    rows = _load_rows(path, complete, warnings)
    summary = None
    if (path / "summary.json").is_file():
        data = _read_json(path / "summary.json", "run summary")
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise SpecbenchError(f"{path / 'summary.json'} must hold {{\"results\": [...]}}")
        summary = data["results"]
        if not all(isinstance(r, dict) and isinstance(r.get("strategy"), str) for r in summary):
            raise SpecbenchError(f"{path / 'summary.json'}: every result needs a 'strategy' name")
    elif complete:
        raise SpecbenchError(f"run {path} is marked complete but has no summary.json")
    nvml_series = None
    if (path / "nvml_series.csv").is_file():
        nvml_series = pd.read_csv(path / "nvml_series.csv")
        missing = {"strategy", "t_s", "metric", "value"} - set(nvml_series.columns)
        if missing:
            raise SpecbenchError(f"{path / 'nvml_series.csv'} lacks column(s) {', '.join(sorted(missing))}")
    return Run(
        path=path,
        label=label,
        meta=meta,
        config=optional_dict("config.json"),
        environment=optional_dict("environment.json"),
        rows=rows,
        summary=summary,
        nvml_series=nvml_series,
    )


def _load_rows(path: Path, complete: bool, warnings: list[str]) -> pd.DataFrame:
    jsonl, parquet = path / "rows.jsonl", path / "rows.parquet"
    if jsonl.is_file():
        records = []
        lines = jsonl.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                if not complete and number == len(lines):
                    warnings.append(f"run {path}: skipped the cut-off last line of rows.jsonl")
                    continue
                raise SpecbenchError(f"{jsonl} line {number} is not valid JSON: {err}") from None
        rows = pd.DataFrame.from_records(records)
    elif parquet.is_file():
        rows = pd.read_parquet(parquet)
    elif complete:
        raise SpecbenchError(f"run {path} is marked complete but has no rows.jsonl or rows.parquet")
    else:
        rows = pd.DataFrame()
    if rows.empty:
        return pd.DataFrame(columns=list(ROW_KEYS))
    missing = [k for k in ROW_KEYS if k not in rows.columns]
    if missing:
        raise SpecbenchError(f"rows of run {path} lack key(s): {', '.join(missing)}")
    return rows


# -- aggregation -----------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _aggregate_rows(rows: pd.DataFrame, strategy: str) -> dict[str, Any]:
    """Per-group figures computed from per-prompt rows (same meaning as summary.json's)."""
    steps = rows["steps"].sum()
    time_total = rows[["draft_s", "verify_s", "other_s"]].to_numpy(dtype=float).sum()
    speedup = geometric_mean(rows["speedup"])
    if strategy == "ar" and math.isnan(speedup):
        speedup = 1.0
    return {
        "prompts": int(rows["prompt_id"].nunique()),
        "new_tokens": int(rows["new_tokens"].sum()),
        "tokens_per_s": _ratio(rows["new_tokens"].sum(), rows["wall_s"].sum()),
        "speedup": speedup,
        "speedup_ci_low": math.nan,
        "speedup_ci_high": math.nan,
        "tau": _ratio((rows["tau"] * rows["steps"]).sum(), steps),
        "draft_efficiency": _ratio(rows["accepted"].sum(), rows["drafted"].sum()),
        "mismatches": int(rows["mismatch"].astype(bool).sum()),
        "draft_frac": _ratio(rows["draft_s"].sum(), time_total),
        "verify_frac": _ratio(rows["verify_s"].sum(), time_total),
        "other_frac": _ratio(rows["other_s"].sum(), time_total),
        "peak_mem_gb": rows["peak_mem_bytes"].max() / 1e9,
    }


def _from_summary(result: dict[str, Any]) -> dict[str, Any]:
    ci = result.get("speedup_ci") or [None, None]
    speedup = result.get("speedup")
    out = {
        **({"batch_size": result["batch_size"]} if "batch_size" in result else {}),
        "prompts": result.get("prompts"),
        "new_tokens": result.get("new_tokens"),
        "tokens_per_s": result.get("tokens_per_s"),
        "speedup": 1.0 if speedup is None and result["strategy"] == "ar" else speedup,
        "speedup_ci_low": ci[0],
        "speedup_ci_high": ci[1],
        "tau": result.get("tau"),
        "draft_efficiency": result.get("draft_efficiency"),
        "mismatches": result.get("mismatches"),
        "draft_frac": result.get("draft_frac"),
        "verify_frac": result.get("verify_frac"),
        "other_frac": result.get("other_frac"),
        "peak_mem_gb": (result["peak_mem_bytes"] / 1e9) if result.get("peak_mem_bytes") is not None else None,
    }
    if result.get("acceptance_by_position"):
        out["accept_by_position"] = " ".join(f"{a:.2f}" for a in result["acceptance_by_position"][:8])
    cost = result.get("cost_model") or {}
    if cost:
        out["predicted_tau"] = cost.get("predicted_tau")
        out["predicted_speedup"] = cost.get("predicted_speedup")
    nvml = result.get("nvml") or {}
    if nvml.get("available"):
        out["mem_util_pct"] = nvml.get("mem_util_pct_mean")
        out["dram_bw_gbs"] = nvml.get("dram_bw_gbs_mean")
        out["energy_j"] = nvml.get("energy_j")
    projection = result.get("projection") or {}
    if projection:
        out["projected_gpu"] = projection.get("gpu")
        out["projected_tokens_per_s"] = projection.get("tokens_per_s")
        out["projected_speedup"] = projection.get("speedup")
        out["projected_fits"] = (projection.get("memory_fit") or {}).get("fits")
    return out


def comparison(runs: Sequence[Run], by: str = "strategy") -> pd.DataFrame:
    """One row per (run, strategy), or per (run, strategy, category) with by="category".

    By strategy a run's summary.json is used where it exists (it carries the bootstrap interval);
    an incomplete run without one is aggregated from its rows. By category everything comes from
    the rows: tokens/s, tau, acceptance and the geometric-mean paired speedup of each category.
    """
    if by not in GROUPINGS:
        raise SpecbenchError(f"unknown grouping '{by}'; choose one of {', '.join(GROUPINGS)}")
    records: list[dict[str, Any]] = []
    for run in runs:
        head = {"run": run.label, "model": run.meta.get("model"), "suite": run.meta.get("suite")}
        by_strategy: dict[str, list[dict[str, Any]]] = {}  # a run with several batch sizes has one per size
        for result in run.summary or []:
            by_strategy.setdefault(result["strategy"], []).append(result)
        for strategy in run.strategies():
            rows = run.rows[run.rows["strategy"] == strategy]
            if by == "strategy":
                if strategy in by_strategy:
                    records += [{**head, "strategy": strategy, **_from_summary(r)} for r in by_strategy[strategy]]
                elif len(rows):
                    records.append({**head, "strategy": strategy, **_aggregate_rows(rows, strategy)})
                continue
            for category, group in rows.groupby("category", sort=True):
                figures = _aggregate_rows(group, strategy)
                for key in ("speedup_ci_low", "speedup_ci_high", "draft_frac", "verify_frac", "other_frac"):
                    figures.pop(key)
                records.append({**head, "strategy": strategy, "category": category, **figures})
    base = STRATEGY_COLUMNS if by == "strategy" else CATEGORY_COLUMNS
    extra = [k for k in dict.fromkeys(k for r in records for k in r) if k not in base and k != "batch_size"]
    columns = list(base)
    if any("batch_size" in r for r in records):
        columns.insert(columns.index("strategy") + 1, "batch_size")
    return pd.DataFrame.from_records(records, columns=[*columns, *extra])


# -- rendering -------------------------------------------------------------------------------

_PERCENT = {"draft_efficiency", "draft_frac", "verify_frac", "other_frac"}
_INTEGER = {"prompts", "new_tokens", "mismatches"}
_HEADERS = {
    "new_tokens": "tokens",
    "tokens_per_s": "tok/s",
    "speedup": "speedup [95% CI]",
    "tau": "tau",
    "draft_efficiency": "accept",
    "mismatches": "mismatch",
    "draft_frac": "draft",
    "verify_frac": "verify",
    "other_frac": "other",
    "peak_mem_gb": "peak GB",
    "accept_by_position": "accept @1..8",
    "predicted_tau": "tau (model)",
    "predicted_speedup": "speedup (model)",
    "mem_util_pct": "mem util %",
    "dram_bw_gbs": "DRAM GB/s",
    "energy_j": "energy J",
    "projected_gpu": "projected on",
    "projected_tokens_per_s": "tok/s (projected)",
    "projected_speedup": "speedup (projected)",
    "projected_fits": "fits (projected)",
    "batch_size": "batch",
}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _cell(column: str, value: Any, row: pd.Series) -> str:
    if _missing(value):
        return "-"
    if column == "speedup":
        low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
        text = f"{value:.2f}x"
        return text if _missing(low) or _missing(high) else f"{text} [{low:.2f}, {high:.2f}]"
    if column in _PERCENT:
        return f"{100 * value:.0f}%"
    if column in {"predicted_speedup", "projected_speedup"}:
        return f"{value:.2f}x"
    if column in _INTEGER:
        return str(int(value))
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "NO"
    if isinstance(value, (float, np.floating)):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def _display(df: pd.DataFrame) -> tuple[list[str], list[list[str]], str]:
    """Columns, formatted cells and a caption; columns equal in every row move to the caption."""
    columns = [c for c in df.columns if c not in {"speedup_ci_low", "speedup_ci_high"}]
    caption_parts = []
    for column in ("run", "model", "suite", "batch_size"):
        if column in columns and df[column].nunique(dropna=False) <= 1:
            columns.remove(column)
            if len(df):
                caption_parts.append(f"{column}: {df[column].iloc[0]}")
    cells = [[_cell(c, row[c], row) for c in columns] for _, row in df.iterrows()]
    return [_HEADERS.get(c, c) for c in columns], cells, ", ".join(caption_parts)


def render(df: pd.DataFrame, fmt: str = "table") -> str | Table:
    """The comparison as a rich Table ("table"), or markdown, CSV or JSON text."""
    if fmt not in FORMATS:
        raise SpecbenchError(f"unknown report format '{fmt}'; choose one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return df.to_json(orient="records", indent=2)
    headers, cells, caption = _display(df)
    if fmt == "markdown":
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return (f"{caption}\n\n" if caption else "") + "\n".join(lines) + "\n"
    table = Table(title=caption or None)
    for header in headers:
        label = header in {"run", "strategy", "category"}
        table.add_column(header, justify="left" if label else "right", no_wrap=label or header == _HEADERS["speedup"])
    for row in cells:
        table.add_row(*row)
    return table
