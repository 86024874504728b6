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
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench import __version__
from specbench.config import FIELDS, RunConfig
from specbench.engines import SPECBENCH, label
from specbench.errors import SpecbenchError
from specbench.files import write_atomic, write_json
from specbench.paths import check_output_dir
from specbench.strict_json import dumps

if TYPE_CHECKING:
    import pandas as pd

STATUSES = ("complete", "incomplete")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, Any]:
    import torch
    import transformers

    try:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        revision = None
    env = {"specbench": __version__, "git_revision": revision, "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
           "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    return env


def _group(row: dict[str, Any]) -> tuple[str, int, int, int]:
    """A row's measured group: prompt, turn, repeat and batch size (1 in runs from before batching)."""
    return row["prompt_id"], row["turn"], row["repeat"], row.get("batch_size", 1)


def run_name(config: RunConfig, strategies: list[str]) -> str:
    """`20261129-101500-ngram-draft-3fa2c1`: start time, strategies (the first three and a count beyond),
    and a hash of the strategies and every setting that changes what is measured."""
    shown = [s.replace("+", "_") for s in strategies if s != "ar"]
    slug = "-".join(shown[:3]) + (f"-and-{len(shown) - 3}-more" if len(shown) > 3 else "") or "ar"
    measured = {k: v for k, v in asdict(config).items() if k != "out"}
    digest = hashlib.sha256(json.dumps([strategies, measured], sort_keys=True, default=str).encode()).hexdigest()
    return f"{datetime.now():%Y%m%d-%H%M%S}-{slug}-{digest[:6]}"


def _read_object(path: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads((path / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecbenchError(f"{path} is not a specbench run directory ({name} missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecbenchError(f"{path / name} is damaged: not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(data, dict):
        raise SpecbenchError(f"{path / name} is damaged: expected a JSON object")
    return data


class RunDir:
    """One run's directory: created fresh or reopened to resume."""

    def __init__(self, path: Path):
        self.path = path
        self.rows_file = path / "rows.jsonl"

    @classmethod
    def create(cls, out: str | Path, config: RunConfig, model: str, suite: str, strategies: list[str],
               drafters: dict[str, Any] | None = None) -> RunDir:
        """A fresh run directory; `drafters` (each strategy's drafter formats and knobs) joins environment.json."""
        path = cls._new_path(Path(out) / "runs", run_name(config, strategies))
        run = cls(path)
        write_json(path / "config.json", asdict(config))
        write_json(path / "environment.json", {**environment(), "drafters": drafters or {}})
        write_json(path / "run.json", {"status": "incomplete", "model": model, "suite": suite, "started": _now(),
                                       "finished": None, "specbench_version": __version__,
                                       "strategies": strategies, "gpu_profile": config.gpu})
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
        values = _read_object(path, "config.json")
        unknown = sorted(set(values) - FIELDS)
        if unknown:
            raise SpecbenchError(f"{path / 'config.json'} is damaged: unknown key(s) {', '.join(unknown)} "
                                 "(or written by another specbench version)")
        return cls(path), RunConfig(**values).validate(where=str(path / "config.json"))

    @classmethod
    def resume(cls, path: str | Path) -> tuple[RunDir, RunConfig]:
        """Reopen an interrupted run to finish it; a complete run is refused and left untouched."""
        run, config = cls.reopen(path)
        if run.meta["status"] == "complete":
            raise SpecbenchError(f"{run.path} is complete: there is nothing to resume and nothing was changed "
                                 f"(its results: {run.path / 'summary.json'})")
        check_output_dir(run.path, "--resume")
        return run, config

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / "run.json").read_text())

    def read_rows(self) -> list[dict[str, Any]]:
        """Rows measured so far; a last line cut off by an interruption is dropped."""
        rows = []
        for line in self.rows_file.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return rows

    def append_rows(self, rows: list[dict[str, Any]]) -> None:
        with self.rows_file.open("a") as f:
            f.write("".join(dumps(r) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())

    def _write_rows(self, rows: list[dict[str, Any]]) -> None:
        write_atomic(self.rows_file, "".join(dumps(r) + "\n" for r in rows))

    def keep_complete_groups(self, strategies: set[str]) -> set[tuple[str, int, int, int]]:
        """Drop rows of a (prompt, turn, repeat, batch size) that not every strategy finished; return the
        finished keys."""
        rows = self.read_rows()
        seen: dict[tuple[str, int, int, int], set[str]] = {}
        for r in rows:
            seen.setdefault(_group(r), set()).add(label(r["strategy"], r.get("engine", SPECBENCH)))
        done = {k for k, v in seen.items() if v >= strategies}
        self._write_rows([r for r in rows if _group(r) in done])
        return done

    def finish(self, frame: pd.DataFrame, summary: list[dict[str, Any]], extra: dict[str, Any], complete: bool) -> None:
        """Write the tables of everything measured; mark the run complete only if nothing is missing.

        `frame` is every row measured, with the paired speedup the run computed from them.
        """
        import pandas as pd

        # rows.jsonl is rewritten whole: no torn tail, so a resumed run appends after valid lines only
        self._write_rows(frame.to_dict("records"))
        if len(frame):
            frame.to_parquet(self.path / "rows.parquet.tmp")
            os.replace(self.path / "rows.parquet.tmp", self.path / "rows.parquet")
            flat = frame.drop(columns=["output_ids"], errors="ignore")
            write_atomic(self.path / "rows.csv", flat.to_csv(index=False))
        write_json(self.path / "summary.json", {"results": summary, **extra})
        table = pd.DataFrame([{k: v for k, v in s.items() if not isinstance(v, (list, dict))} for s in summary])
        write_atomic(self.path / "summary.csv", table.to_csv(index=False))
        write_atomic(self.path / "summary.md", table.to_markdown(index=False, floatfmt=".3g") + "\n")
        meta = self.meta
        meta.update(status="complete" if complete else "incomplete", finished=_now())
        if "noise" in extra:
            meta["noise"] = {k: extra["noise"][k] for k in ("noisy", "reasons", "advice")}
        write_json(self.path / "run.json", meta)
