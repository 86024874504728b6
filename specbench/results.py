"""Run directories under results/: written atomically, appended prompt by prompt, resumable.

Layout: run.json (status, model, suite, strategies), config.json, environment.json,
rows.jsonl (one row per strategy x prompt x turn x repeat, appended as measured),
and at the end rows.parquet, rows.csv, summary.json, summary.csv, summary.md.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from specbench import __version__
from specbench.config import RunConfig
from specbench.errors import SpecbenchError
from specbench.strict_json import dumps


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, dumps(data, indent=2) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, Any]:
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


class RunDir:
    """One run's directory: created fresh or reopened to resume."""

    def __init__(self, path: Path):
        self.path = path
        self.rows_file = path / "rows.jsonl"

    @classmethod
    def create(cls, out: str | Path, config: RunConfig, model: str, suite: str, strategies: list[str],
               drafters: dict[str, Any] | None = None) -> RunDir:
        """A fresh run directory; `drafters` (each strategy's drafter formats and knobs) joins environment.json."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        slug = "-".join(s.replace("+", "_") for s in strategies[1:4]) or "ar"
        path = Path(out) / "runs" / f"{stamp}-{slug}"
        n = 1
        while path.exists():
            n += 1
            path = Path(out) / "runs" / f"{stamp}-{slug}-{n}"
        path.mkdir(parents=True)
        run = cls(path)
        write_json(path / "config.json", asdict(config))
        write_json(path / "environment.json", {**environment(), "drafters": drafters or {}})
        write_json(path / "run.json", {"status": "incomplete", "model": model, "suite": suite, "started": _now(),
                                       "finished": None, "specbench_version": __version__,
                                       "strategies": strategies, "gpu_profile": config.gpu})
        run.rows_file.touch()
        return run

    @classmethod
    def reopen(cls, path: str | Path) -> tuple[RunDir, RunConfig]:
        path = Path(path)
        if not (path / "run.json").is_file() or not (path / "config.json").is_file():
            raise SpecbenchError(f"{path} is not a specbench run directory (run.json / config.json missing)")
        config = RunConfig(**json.loads((path / "config.json").read_text())).validate()
        return cls(path), config

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

    def keep_complete_groups(self, strategies: set[str]) -> set[tuple[str, int, int]]:
        """Drop rows of a (prompt, turn, repeat) that not every strategy finished; return the finished keys."""
        rows = self.read_rows()
        seen: dict[tuple[str, int, int], set[str]] = {}
        for r in rows:
            seen.setdefault((r["prompt_id"], r["turn"], r["repeat"]), set()).add(r["strategy"])
        done = {k for k, v in seen.items() if v >= strategies}
        self._write_rows([r for r in rows if (r["prompt_id"], r["turn"], r["repeat"]) in done])
        return done

    def finish(self, frame: pd.DataFrame, summary: list[dict[str, Any]], extra: dict[str, Any], complete: bool) -> None:
        """Write the tables of everything measured; mark the run complete only if nothing is missing.

        `frame` is every row measured, with the paired speedup the run computed from them.
        """
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
        write_json(self.path / "run.json", meta)
