"""A serve run's directory under results/serve/: written atomically level by level, resumable.

Layout: serve.json (status, the configuration, the strategies and levels, notes), levels/<strategy>/<level>.json
(the level's request log, its summary and the server's speculative counters; written once the level
ends), logs/<strategy>.log (each started server's own output), and at the end summary.json (every level's
figures against `ar`, crossovers, capacities), schedule.json (each strategy's per-load vLLM setting) and
the plots. A level whose server died is written as incomplete; `--resume` measures again every level
without a complete file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json, write_json
from specbench.core.records.serve_records import LevelFile, RequestRecord
from specbench.report.run_dir import RunDir, _now
from specbench.serving.serve_config import Level, ServeConfig, ServeLoad, endpoint_headers

SERVE_JSON = "serve.json"


def serve_name(config: ServeConfig, strategies: list[str]) -> str:
    """`20261202-193000-serve-ngram-eagle-3fa2c1`: start time, strategies and a hash of the configuration."""
    shown = [s for s in strategies if s != "ar"][:3]
    digest = hashlib.sha256(json.dumps([strategies, config.as_json()], sort_keys=True, default=str).encode())
    return f"{datetime.now():%Y%m%d-%H%M%S}-serve-{'-'.join(shown) or 'ar'}-{digest.hexdigest()[:6]}"


class ServeRun:
    def __init__(self, path: Path, meta: dict[str, Any], config: ServeConfig | None = None):
        self.path = Path(path)
        self.meta = meta
        self.config = config  # what is served, its endpoints' credentials with it; None where the run is only read

    @property
    def load(self) -> ServeLoad:
        """The run's load as saved, read without planning its run again (for summaries and reports)."""
        return ServeLoad(**{k: v for k, v in self.meta["config"].items() if k != "run"})

    @property
    def strategies(self) -> list[str]:
        return self.meta["strategies"]

    @classmethod
    def create(cls, config: ServeConfig, strategies: list[str], model: str, suite: str) -> ServeRun:
        path = RunDir._new_path(Path(config.run.out) / "serve", serve_name(config, strategies))
        run = cls(path, {"status": "incomplete", "kind": "serve", "model": model, "suite": suite, "started": _now(),
                         "finished": None, "strategies": strategies, "levels": [lv.key for lv in config.levels],
                         "config": config.as_json(), "notes": []}, config)
        run.save()
        return run

    @classmethod
    def open(cls, path: str | Path) -> ServeRun:
        path = Path(path)
        meta = read_json(path / SERVE_JSON, "serve run file") if (path / SERVE_JSON).is_file() else None
        if not isinstance(meta, dict) or meta.get("kind") != "serve" or "config" not in meta:
            raise SpecbenchError(f"{path} is not a specbench serve run directory (no {SERVE_JSON})")
        return cls(path, meta)

    @classmethod
    def resume(cls, path: str | Path, api_key: str | None = None, headers: dict[str, str] | None = None) -> ServeRun:
        """The unfinished run at `path` with its saved configuration checked and planned again, its endpoints sent
        `api_key` and `headers`."""
        run = cls.open(path)
        if run.meta["status"] == "complete":
            raise SpecbenchError(f"{run.path} is complete: there is nothing to resume and nothing was changed")
        saved = run.meta["config"]
        run.config = ServeConfig.from_json(saved, endpoint_headers(saved["endpoints"], api_key, headers or {}))
        return run

    def save(self) -> None:
        write_json(self.path / SERVE_JSON, self.meta)

    def level_file(self, strategy: str, level: Level) -> Path:
        return self.path / "levels" / strategy / f"{level.key}.json"

    def log_file(self, strategy: str) -> Path:
        return self.path / "logs" / f"{strategy}.log"

    def level_data(self, strategy: str, level: Level) -> LevelFile | None:
        """The level's record as written (complete or not); None where it was never written."""
        path = self.level_file(strategy, level)
        return LevelFile.from_dict(read_json(path, "serve level file"), str(path)) if path.is_file() else None

    def measured(self, strategy: str, level: Level) -> LevelFile | None:
        """The level's record if it was measured completely, else None."""
        data = self.level_data(strategy, level)
        return data if data and data.complete else None

    def write_level(self, strategy: str, level: Level, records: list[RequestRecord], **fields: Any) -> None:
        path = self.level_file(strategy, level)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, LevelFile(strategy=strategy, level=asdict(level), records=records, **fields).as_dict())

    def note(self, text: str) -> None:
        self.meta["notes"].append(text)
        self.save()

    def finish(self, complete: bool) -> None:
        self.meta.update(status="complete" if complete else "incomplete", finished=_now())
        self.save()

