"""Run directories under results/: written atomically, appended prompt by prompt, resumable.

Layout: run.json (status, model, suite, strategies), config.json, environment.json,
rows.jsonl (one row per strategy x prompt x turn x repeat, appended as measured),
and at the end rows.parquet, rows.csv, summary.json, summary.csv, summary.md.

A directory is named after its start time, its strategies and a short hash of everything that
decides what is measured, so two runs cannot be confused. Opening a run to resume it is
torch-free (pandas and torch are imported where rows are summarised), so `--resume` of a broken
or complete run is refused at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specbench.core.engine_names import label
from specbench.core.errors import SpecbenchError
from specbench.core.files import atomic_path, read_json, read_json_object, read_jsonl, write_atomic, write_json
from specbench.core.paths import check_output_dir
from specbench.core.records import STATUSES, Environment, NoiseVerdict, Row, RunMeta, RunResult, SummaryFile, rows_frame
from specbench.core.strict_json import dumps
from specbench.core.version import __version__
from specbench.methods.names import BASELINE
from specbench.plan.run_config import FIELDS, RunConfig


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment(drafters: dict[str, Any] | None = None) -> Environment:
    """This machine and its software, and the drafters' formats and knobs (`drafters`)."""
    import torch
    import transformers

    try:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        revision = None
    return Environment(__version__, revision, platform.python_version(), torch.__version__, transformers.__version__,
                       platform.platform(), platform.processor() or platform.machine(), os.cpu_count(),
                       torch.get_num_threads(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                       drafters or {})


def group_of(row: Row) -> tuple[str, int, int, int]:
    """A row's measured group: prompt, turn, repeat and batch size."""
    return row.prompt_id, row.turn, row.repeat, row.batch_size


def run_name(config: RunConfig, strategies: list[str]) -> str:
    """`20261129-101500-ngram-draft-3fa2c1`: start time, strategies (the first three and a count beyond),
    and a hash of the strategies and every setting that changes what is measured."""
    shown = [s.replace("+", "_") for s in strategies if s != BASELINE]
    slug = "-".join(shown[:3]) + (f"-and-{len(shown) - 3}-more" if len(shown) > 3 else "") or BASELINE
    measured = {k: v for k, v in asdict(config).items() if k != "out"}
    digest = hashlib.sha256(json.dumps([strategies, measured], sort_keys=True, default=str).encode()).hexdigest()
    return f"{datetime.now():%Y%m%d-%H%M%S}-{slug}-{digest[:6]}"


def _read_object(path: Path, name: str) -> dict[str, Any]:
    if not (path / name).is_file():
        raise SpecbenchError(f"{path} is not a specbench run directory ({name} missing)")
    return read_json_object(path / name, "run file")


class RunDir:
    """One run's directory: created fresh or reopened to resume."""

    def __init__(self, path: Path, meta: RunMeta, config: dict[str, Any], environment: Environment):
        self.path = path
        self.rows_file = path / "rows.jsonl"
        self.meta = meta  # run.json, config.json and environment.json as written
        self.config = config
        self.environment = environment

    @classmethod
    def create(cls, out: str | Path, config: RunConfig, model: str, suite: str, strategies: list[str],
               drafters: dict[str, Any] | None = None) -> RunDir:
        """A fresh run directory; `drafters` (each strategy's drafter formats and knobs) joins environment.json."""
        path = cls._new_path(Path(out) / "runs", run_name(config, strategies))
        run = cls(path, RunMeta("incomplete", model, suite, _now(), None, __version__, strategies, config.gpu),
                  asdict(config), environment(drafters))
        write_json(path / "config.json", run.config)
        write_json(path / "environment.json", run.environment.as_dict())
        write_json(path / "run.json", run.meta.as_dict())
        run.rows_file.touch()
        return run

    @staticmethod
    def _new_path(parent: Path, name: str) -> Path:
        """A directory of its own under `parent`, even when another run starts in the same second."""
        for n in range(1, 1000):
            path = parent / (name if n == 1 else f"{name}-{n}")
            try:
                path.mkdir(parents=True)
                return path
            except FileExistsError:
                continue
            except OSError as exc:
                raise SpecbenchError(f"cannot create the run directory {path} ({exc.strerror})") from None
        raise SpecbenchError(f"{parent}: too many runs named {name}")

    @classmethod
    def reopen(cls, path: str | Path) -> tuple[RunDir, RunConfig]:
        """An existing run and its saved configuration, both checked: a damaged file is one clear line."""
        path = Path(path)
        if not path.is_dir():
            raise SpecbenchError(f"{path} is not a specbench run directory (no such directory)")
        meta = _read_object(path, "run.json")
        if meta.get("status") not in STATUSES or not isinstance(meta.get("strategies"), list):
            raise SpecbenchError(f"{path / 'run.json'} is damaged: it lacks a status ({' or '.join(STATUSES)}) "
                                 "and the list of strategies")
        meta = _run_meta(meta, path)
        values = _read_object(path, "config.json")
        unknown = sorted(set(values) - FIELDS)
        if unknown:
            raise SpecbenchError(f"{path / 'config.json'} is damaged: unknown key(s) {', '.join(unknown)} "
                                 "(or written by another specbench version)")
        run = cls(path, meta, values, _environment(path))
        return run, RunConfig(**values).validate(where=str(path / "config.json"))

    @classmethod
    def resume(cls, path: str | Path) -> tuple[RunDir, RunConfig]:
        """Reopen an interrupted run to finish it; a complete run is refused and left untouched."""
        run, config = cls.reopen(path)
        if run.meta.complete:
            raise SpecbenchError(f"{run.path} is complete: there is nothing to resume and nothing was changed "
                                 f"(its results: {run.path / 'summary.json'})")
        check_output_dir(run.path, "--resume")
        return run, config

    def read_rows(self) -> list[Row]:
        """Rows measured so far; a last line cut off by an interruption is dropped."""
        records, _ = read_jsonl(self.rows_file, "rows", cut_tail=True)
        return [Row.from_dict(r, f"rows of run {self.path}") for r in records]

    def append_rows(self, rows: list[Row]) -> None:
        with self.rows_file.open("a") as f:
            f.write("".join(dumps(r.as_dict()) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())

    def _write_rows(self, rows: list[Row]) -> None:
        write_atomic(self.rows_file, "".join(dumps(r.as_dict()) + "\n" for r in rows))

    def keep_complete_groups(self, strategies: set[str]) -> list[Row]:
        """Drop rows of a (prompt, turn, repeat, batch size) that not every strategy finished; return the rows kept."""
        rows = self.read_rows()
        seen: dict[tuple[str, int, int, int], set[str]] = {}
        for r in rows:
            seen.setdefault(group_of(r), set()).add(label(r.strategy, r.engine))
        done = {k for k, v in seen.items() if v >= strategies}
        kept = [r for r in rows if group_of(r) in done]
        self._write_rows(kept)
        return kept

    def finish(self, result: RunResult) -> None:
        """Write the tables of everything measured, and run.json with the result's status; the result's
        `meta` becomes run.json as written."""
        import pandas as pd

        # rows.jsonl is rewritten whole: no torn tail, so a resumed run appends after valid lines only
        self._write_rows(result.rows)
        if result.rows:
            frame = pd.DataFrame([r.as_dict() for r in result.rows])  # the columns the rows have, as rows.jsonl
            with atomic_path(self.path / "rows.parquet") as tmp:
                frame.to_parquet(tmp)
            flat = frame.drop(columns=["output_ids"], errors="ignore")
            write_atomic(self.path / "rows.csv", flat.to_csv(index=False))
        if result.nvml_series:
            write_atomic(self.path / "nvml_series.csv", pd.DataFrame(result.nvml_series).to_csv(index=False))
        write_json(self.path / "summary.json", result.summary_json())
        summaries = [s.as_dict() for s in result.summary]
        table = pd.DataFrame([{k: v for k, v in s.items() if not isinstance(v, (list, dict))} for s in summaries])
        write_atomic(self.path / "summary.csv", table.to_csv(index=False))
        write_atomic(self.path / "summary.md", table.to_markdown(index=False, floatfmt=".3g") + "\n")
        noise = result.noise
        verdict = NoiseVerdict(noise.noisy, noise.reasons, noise.advice) if noise is not None else result.meta.noise
        result.meta = replace(result.meta, finished=_now(), noise=verdict)
        self.meta = result.meta
        write_json(self.path / "run.json", result.meta.as_dict())


# -- reading a run directory back --------------------------------------------------------------


def _run_meta(meta: dict[str, Any], path: Path) -> RunMeta:
    return RunMeta.from_dict(meta, str(path / "run.json"))


def _environment(path: Path) -> Environment:
    return Environment.from_dict(_optional_dict(path / "environment.json"), str(path / "environment.json"))


def _optional_dict(path: Path) -> dict[str, Any]:
    return read_json_object(path, path.name) if path.is_file() else {}


def read_run(path: Path, label: str = "", warnings: list[str] | None = None) -> RunResult:
    """A run directory as the RunResult that wrote it. A run that never finished (interrupted, killed
    with its last row cut off) gives the summaries of the rows it holds, as a finished run would; what
    a reader should know about it joins `warnings`."""
    warnings = [] if warnings is None else warnings
    if not path.is_dir():
        raise SpecbenchError(f"{path} is not a specbench run directory (not a directory)")
    if not (path / "run.json").is_file():
        raise SpecbenchError(f"{path} is not a specbench run directory (no run.json)")
    meta = read_json(path / "run.json", "run metadata")
    if not isinstance(meta, dict) or meta.get("status") not in STATUSES:
        raise SpecbenchError(f"{path / 'run.json'}: 'status' must be one of {', '.join(STATUSES)}")
    meta = _run_meta(meta, path)
    complete = meta.complete
    config = _optional_dict(path / "config.json")
    rows = _read_rows(path, complete, warnings, {"batch_size": config.get("batch_size") or 1})
    saved = _optional_dict(path / "summary.json")
    if complete and not saved:
        raise SpecbenchError(f"run {path} is marked complete but has no summary.json")
    where = str(path / "summary.json")
    if complete and (not isinstance(saved.get("results"), list) or not all(
            isinstance(r, dict) and isinstance(r.get("strategy"), str) for r in saved["results"])):
        raise SpecbenchError(f"{where} must hold {{\"results\": [...]}} with a strategy each")
    # an unfinished run's summaries are those of its rows, whatever an earlier finish left
    noted = SummaryFile.from_dict({**saved, "results": saved["results"] if complete else []}, where)
    if complete:
        summary, by_category = noted.results, noted.by_category
    else:  # what the rows hold, summarised as a finished run would be
        from specbench.analysis.stats import summarise_strategies

        frame = rows_frame(rows)
        summary = summarise_strategies(frame) if rows else []
        by_category = summarise_strategies(frame, by="category") if rows else []
    series = []
    if (path / "nvml_series.csv").is_file():
        import pandas as pd

        frame = pd.read_csv(path / "nvml_series.csv")
        missing = {"strategy", "t_s", "metric", "value"} - set(frame.columns)
        if missing:
            raise SpecbenchError(f"{path / 'nvml_series.csv'} lacks column(s) {', '.join(sorted(missing))}")
        series = frame.to_dict("records")
    return RunResult(path, meta, config, _environment(path), rows, summary, by_category,
                     nvml_series=series, label=label, **RunResult.noted(noted))


def saved_config(run: RunResult) -> RunConfig:
    """The configuration a run measured with, from its config.json: what an older run's file lacks takes
    RunConfig's default, and a key of no field (an older run's `batch_size`) is left out."""
    return RunConfig(**{k: v for k, v in run.config.items() if k in FIELDS})


def _read_rows(path: Path, complete: bool, warnings: list[str], defaults: dict[str, Any]) -> list[Row]:
    """The rows of a run directory; `defaults` fills what rows of older versions lack (their batch size
    was the run's)."""
    jsonl, parquet = path / "rows.jsonl", path / "rows.parquet"
    where = f"rows of run {path}"
    if jsonl.is_file():
        records, cut = read_jsonl(jsonl, "rows", cut_tail=not complete)
        if cut:
            warnings.append(f"run {path}: skipped the cut-off last line of rows.jsonl")
    elif parquet.is_file():
        import pandas as pd

        records = pd.read_parquet(parquet).to_dict("records")
    elif complete:
        raise SpecbenchError(f"run {path} is marked complete but has no rows.jsonl or rows.parquet")
    else:
        records = []
    return [Row.from_dict({**defaults, **r}, where) for r in records]
