"""Render runs' summaries as comparison tables.

Every figure comes from analysis/stats.py, through the RunResult a run produced or read back from its
directory (report.run_dir.read_run: a finished run's summary.json, or for a run that never finished the same
`summarise_strategies` over the rows it holds). This module only renders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table

from specbench.analysis.lossless import divergences, mismatch_detail
from specbench.core.engine_names import label
from specbench.core.errors import SpecbenchError
from specbench.core.markdown import markdown_table
from specbench.core.records import COLUMN_SPECS, RunResult, StrategySummary
from specbench.core.strict_json import dumps
from specbench.methods.names import BASELINE
from specbench.report.run_dir import read_run, saved_config

FORMATS = ("table", "markdown", "csv", "json")
GROUPINGS = ("strategy", "category")
POSITION_COLUMNS = ("acceptance_rate_by_position", "conditional_acceptance_by_position")  # lists, per position
SETTINGS = ("model", "max_new_tokens", "temperature", "top_p", "top_k", "dtype")
"""Runs that differ in any of these are not comparable and are shown in separate groups."""

COLUMNS = ("strategy", "speedup", "tokens_per_s", "tau", "draft_efficiency", "mismatches")
"""The default table: what a user needs first, within 80 columns."""
WIDE_COLUMNS = ("prompts", "new_tokens", "share_prefill", "share_draft", "share_verify", "share_other",
                "memory_gb", "peak_mem_gb", "predicted_speedup", "measured_over_predicted",
                "projected_speedup", "projected_tokens_per_s", "projected_fits", "mem_util_pct", "dram_bw_gbs",
                "energy_j")
"""`--wide` adds these (those a run has)."""


def column_header(column: str) -> str:
    spec = COLUMN_SPECS.get(column)
    return spec.header if spec else column


def settings(run: RunResult) -> tuple:
    """What must match for two runs' figures to be compared."""
    config = saved_config(run)
    return run.model, *(getattr(config, k) for k in SETTINGS[1:])


# -- loading ---------------------------------------------------------------------------------


def load_runs(dirs: Sequence[Path | str]) -> tuple[list[RunResult], list[str]]:
    """Load run directories; returns the runs and warnings for the caller to print.

    Not a run directory -> SpecbenchError. A run that never finished (interrupted, or killed with its
    last row cut off) loads with the summaries of the rows it holds, with a warning; so do greedy
    mismatches, and runs whose models or settings differ (they are shown in separate groups).
    """
    if not dirs:
        raise SpecbenchError("no run directories given")
    paths = [Path(d) for d in dirs]
    names = [p.resolve().name for p in paths]
    runs: list[RunResult] = []
    warnings: list[str] = []
    for path, name in zip(paths, names, strict=True):
        run = read_run(path, name if names.count(name) == 1 else str(path), warnings)
        runs.append(run)
        if not run.complete:
            warnings.append(f"run {path} is incomplete: showing what its {len(run.rows)} rows hold")
        bad = run.frame()
        bad = bad[bad["mismatch"].fillna(False).astype(bool)]
        for strategy, rows in bad.groupby("strategy"):
            warnings.append(f"run {path}: strategy {strategy} has {len(rows)} greedy mismatch(es) against ar"
                            + mismatch_detail(*divergences(rows)))
    if len({settings(run) for run in runs}) > 1:
        warnings.append("the runs differ in model or settings (" + ", ".join(SETTINGS) + "): they are shown in "
                        "separate groups, not compared")
    return runs, warnings


# -- the comparison frame ----------------------------------------------------------------------


def _flat(summary: StrategySummary) -> dict[str, Any]:
    """One summary as flat columns (the figures, renamed for tables; nothing recomputed)."""
    out = {k: getattr(summary, k) for k in ("prompts", "new_tokens", "tokens_per_s", "speedup", "tau",
                                            "draft_efficiency", "mismatches", "transfer")}
    out.update(outliers=len(summary.outliers or []), speedup_ci_low=summary.speedup_ci[0],
               speedup_ci_high=summary.speedup_ci[1],
               acceptance_rate_by_position=summary.acceptance_rate_by_position or [],  # [] in runs before it
               conditional_acceptance_by_position=summary.conditional_acceptance_by_position)
    for part, share in summary.time_shares.items():
        out[f"share_{part}"] = share
    out.update(memory_gb=summary.memory_bytes / 1e9, peak_mem_gb=summary.peak_mem_bytes / 1e9)
    if summary.cost_model:
        out["predicted_speedup"] = summary.cost_model.predicted_speedup
        out["measured_over_predicted"] = summary.cost_model.measured_over_predicted
    nvml = summary.nvml
    if nvml and nvml["available"]:
        out.update(mem_util_pct=nvml.get("mem_util_pct_mean"), dram_bw_gbs=nvml.get("dram_bw_gbs_mean"),
                   energy_j=nvml["energy_j"])
    projection = summary.projection
    if projection:
        out.update(projected_gpu=projection.gpu, projected_speedup=projection.speedup,
                   projected_tokens_per_s=projection.tokens_per_s, projected_fits=projection.memory_fit["fits"])
    return out


def comparison(runs: Sequence[RunResult], by: str = "strategy") -> pd.DataFrame:
    """One row per (run, strategy), or per (run, strategy, category) with by="category", from the runs'
    summaries; `group` numbers the sets of runs with the same model and settings."""
    if by not in GROUPINGS:
        raise SpecbenchError(f"unknown grouping '{by}'; choose one of {', '.join(GROUPINGS)}")
    groups = list(dict.fromkeys(settings(run) for run in runs))
    records = []
    for run in runs:
        head = {"group": groups.index(settings(run)) + 1, "run": run.label, "model": run.model, "suite": run.suite}
        for summary in run.summary if by == "strategy" else run.by_category:
            extra = {"category": summary.category} if by == "category" else {}
            extra["batch_size"] = summary.batch_size  # a batched run has one summary per batch size
            records.append({**head, "strategy": label(summary.strategy, summary.engine), "engine": summary.engine,
                            "baseline": summary.strategy == BASELINE, **extra, **_flat(summary)})
    return pd.DataFrame.from_records(records)


# -- rendering -------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _cell(column: str, row: pd.Series, noisy: bool = False) -> str:
    value = row.get(column)
    stalled = "!" if row.get("outliers") else ""
    if row.get("baseline") and column in ("speedup", "mismatches", "transfer"):
        return f"{stalled}1.00x" if column == "speedup" else "-"  # the baseline itself
    if column == "mismatches":
        return "n/a" if _missing(value) else str(int(value))
    if _missing(value):
        return "-"
    if column == "speedup":
        low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
        text = ("~" if noisy else "") + f"{stalled}{value:.2f}x"
        return text if _missing(low) or _missing(high) else f"{text} [{low:.2f}, {high:.2f}]"
    form = COLUMN_SPECS[column].form if column in COLUMN_SPECS else None
    if form == "percent":
        return f"{100 * value:.0f}%"
    if form == "x":
        return f"{value:.2f}x"
    if form == "count":
        return str(int(value))
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, (int, float)):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def columns_of(frame: pd.DataFrame, wide: bool = False) -> list[str]:
    extra = [c for c in WIDE_COLUMNS if wide and c in frame and frame[c].notna().any()]
    head = ["run"] if frame["run"].nunique() > 1 else []
    batch = ["batch_size"] if frame["batch_size"].nunique() > 1 else []
    main = list(COLUMNS[1:])
    if "transfer" in frame and frame["transfer"].notna().any():  # both engines: the efficiency goes to --wide
        main = ["speedup", "transfer"] + [c for c in main[1:] if c != "draft_efficiency"]
        extra = (["draft_efficiency"] if wide else []) + extra
    return head + list(COLUMNS[:1]) + (["category"] if "category" in frame else []) + batch + main + extra


def legend(columns: Sequence[str]) -> list[str]:
    return [f"{column_header(c)}: {COLUMN_SPECS[c].legend}" for c in columns if c in COLUMN_SPECS]


def _caption(frame: pd.DataFrame) -> str:
    parts = [f"{c}: {frame[c].iloc[0]}" for c in ("run", "model", "suite") if c in frame and frame[c].nunique() == 1]
    return ", ".join(parts)


def render(frame: pd.DataFrame, fmt: str = "table", wide: bool = False,
           noisy: Sequence[str] = ()) -> str | Table | list[Table]:
    """The comparison as rich Tables (one per group of comparable runs), or Markdown, CSV or JSON text.
    Runs named in `noisy` get their speedups marked with ~."""
    if fmt not in FORMATS:
        raise SpecbenchError(f"unknown report format '{fmt}'; choose one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return frame.assign(**{column: frame[column].map(lambda v: " ".join(f"{a:.3f}" for a in v))
                               for column in POSITION_COLUMNS}).to_csv(index=False)
    if fmt == "json":
        return dumps(frame.to_dict("records"), indent=2) + "\n"
    tables, texts = [], []
    for _, group in frame.groupby("group", sort=True):
        columns = columns_of(group, wide)
        cells = [[_cell(c, row, row.get("run") in noisy) for c in columns] for _, row in group.iterrows()]
        headers = [column_header(c) for c in columns]
        caption = _caption(group)
        if fmt == "markdown":
            texts.append((f"{caption}\n\n" if caption else "") + markdown_table(headers, cells) + "\n")
            continue
        table = Table(title=caption or None)
        for column, header in zip(columns, headers):
            label = column in ("run", "strategy", "category")
            table.add_column(header, justify="left" if label else "right", no_wrap=True)
        for row in cells:
            table.add_row(*row)
        tables.append(table)
    return "\n".join(texts) if fmt == "markdown" else tables


def acceptance_table(frame: pd.DataFrame, fmt: str = "table", positions: int = 8) -> str | Table | None:
    """Per-position acceptance of every drafting strategy as vLLM reports it (drafts that accepted
    position k / drafts), as its own small table."""
    rates = "acceptance_rate_by_position"
    rows = list({r["strategy"]: r for _, r in frame.iloc[::-1].iterrows() if len(r[rates])}
                .values())[::-1]  # one per strategy: acceptance does not depend on the batch size
    if not rows:
        return None
    width = min(positions, max(len(r[rates]) for r in rows))
    headers = ["strategy"] + [f"p{k}" for k in range(1, width + 1)]
    cells = [[r["strategy"]] + [f"{a:.2f}" for a in r[rates][:width]] + ["-"] * (width - len(r[rates][:width]))
             for r in rows]
    title = "acceptance at position k: drafts accepting it / drafts"
    if fmt == "markdown":
        return f"{title}\n\n" + markdown_table(headers, cells) + "\n"
    table = Table(title=title)
    for header in headers:
        table.add_column(header, justify="left" if header == "strategy" else "right", no_wrap=True)
    for c in cells:
        table.add_row(*c)
    return table


def footer(runs: Sequence[RunResult]) -> list[str]:
    """What a reader must know about the runs' trustworthiness: noise, few prompts, skipped prompts."""
    lines = []
    for run in runs:
        noise = run.noise
        name = f"run {run.label}: " if len(runs) > 1 else ""
        if noise and noise.noisy:
            lines.append(f"~ {name}noisy machine: {'; '.join(noise.reasons)}; the timings are marked ~")
        if noise and noise.advice:
            lines.append(f"{name}note: " + "; ".join(noise.advice))
        lines += outlier_lines(run, name)
        if run.skipped_prompts:
            lines.append(f"{name}{len(run.skipped_prompts)} prompt(s) skipped: longer than the model's "
                         "context with the answer")
    return lines


def outlier_lines(run: RunResult, name: str = "") -> list[str]:
    """The prompts of a run measured again, each with both timings, under the rule that flagged them."""
    again = [(label(s.strategy, s.engine), s.batch_size, o) for s in run.summary for o in s.outliers or []]
    if not again:
        return []
    k = saved_config(run).outlier_k
    lines = [f"! {name}{len(again)} prompt(s) measured again (above median + {k:g} MAD of their strategy's seconds "
             "per token, or stalled by the engine compiling or falling back): the speedups marked ! use the second "
             "timing"]
    for strategy, batch, o in again:
        where = f" (batch size {batch})" if batch > 1 else ""
        lines.append(f"!   {strategy}{where}: {o.prompt_id} turn {o.turn}: {o.first_wall_s:.2f} s, again "
                     f"{o.wall_s:.2f} s ({o.cause})")
    return lines


def noisy_runs(runs: Sequence[RunResult]) -> list[str]:
    return [run.label for run in runs if run.noise and run.noise.noisy]
