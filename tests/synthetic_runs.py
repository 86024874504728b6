"""Run directories in the bench's schema with planted speedups, for recommend's tests.

Rows follow what `measuring.make_rows` writes; summary.json comes from `measure.stats.summarize` over
them, as `summarise.finish` writes it, so the readers meet the real schema.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specbench.config import RunConfig
from specbench.measure.stats import paired_speedups, summarize

BASE_BYTES = 80_000_000  # the target's weights
KV_BYTES_PER_TOKEN = 50_000
DRAFTER_BYTES = 10_000_000


def write_run(root: Path, name: str, speedups: dict[str, Any], *, categories: tuple[str, ...] = ("code", "chat"),
              prompts: int = 6, model: str = "default", cuda: str | None = None, temperature: float = 0.0,
              batch_size: int | None = None, knobs: dict | None = None, drafter_bytes: dict[str, int] | None = None,
              projections: dict[str, dict] | None = None, mismatched: tuple[str, ...] = (), noise: float = 0.02,
              seed: int = 0, modelled: dict[int, dict[str, float]] | None = None) -> Path:
    """A complete run under root/runs/name. `speedups`: strategy -> speedup, or -> {category: speedup};
    `modelled`: batch size -> strategy -> the speedup its load axis models there."""
    rng = np.random.default_rng(seed)
    path = root / "runs" / name
    path.mkdir(parents=True)
    strategies = ["ar", *speedups]
    rows = []
    for category in categories:
        for i in range(prompts):
            prompt_tokens = 40 + 7 * i
            ar_wall = 1.0 + 0.1 * i
            for strategy in strategies:
                if strategy == "ar":
                    speedup = 1.0
                else:
                    value = speedups[strategy]
                    speedup = value[category] if isinstance(value, dict) else value
                wall = ar_wall / speedup * (1 + noise * rng.standard_normal()) if strategy != "ar" else ar_wall
                rows.append(_row(strategy, category, i, prompt_tokens, wall, drafter_bytes or {},
                                 strategy in mismatched))
    frame = pd.DataFrame(rows)
    frame["speedup"] = paired_speedups(frame)
    summary = [s.as_dict() for s in summarize(frame)]
    for result in summary:
        if projections and result["strategy"] in projections:
            result["projection"] = projections[result["strategy"]]
    config = asdict(RunConfig(strategies=list(speedups), temperature=temperature, knobs=knobs or {}))
    if batch_size is not None:
        config["batch_size"] = batch_size
    files = {
        "run.json": {"status": "complete", "model": model, "suite": "specbench", "strategies": strategies,
                     "started": "2026-12-01T00:00:00+00:00", "finished": "2026-12-01T00:01:00+00:00"},
        "config.json": config,
        "environment.json": {"cuda": cuda, "torch": "2.13.0"},
        "summary.json": {"results": summary, "load": {"points": [
            {"strategy": s, "batch_size": b, "modelled_speedup": v} for b, at in (modelled or {}).items()
            for s, v in at.items()]}},
    }
    for file, data in files.items():
        (path / file).write_text(json.dumps(data, default=float))
    (path / "rows.jsonl").write_text("".join(json.dumps(r, default=float) + "\n" for r in frame.to_dict("records")))
    return path


def _row(strategy: str, category: str, i: int, prompt_tokens: int, wall: float, drafter_bytes: dict[str, int],
         mismatch: bool) -> dict[str, Any]:
    new_tokens = 32
    steps = 32 if strategy == "ar" else 16
    extra = 0 if strategy == "ar" else drafter_bytes.get(strategy, DRAFTER_BYTES)
    return {
        "strategy": strategy, "prompt_id": f"specbench-{category}-{i}", "category": category, "turn": 0, "repeat": 0,
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "wall_s": wall, "ttft_s": 0.05 * wall,
        "tpot_s": wall / new_tokens, "steps": steps, "tau": new_tokens / steps,
        "drafted": 0 if strategy == "ar" else 48, "accepted": 0 if strategy == "ar" else 16,
        "verified": steps if strategy == "ar" else 64, "draft_depth": 0 if strategy == "ar" else 48,
        "accept_by_position": [] if strategy == "ar" else [10, 6], "prefill_s": 0.05 * wall,
        "draft_s": 0.0 if strategy == "ar" else 0.2 * wall, "verify_s": 0.7 * wall, "other_s": 0.05 * wall,
        "memory_bytes": BASE_BYTES + KV_BYTES_PER_TOKEN * (prompt_tokens + new_tokens + 1) + extra,
        "peak_mem_bytes": 600_000_000, "stop_reason": "length", "mismatch": mismatch,
        "first_divergence": 3 if mismatch else None, "divergence_margin": 0.0 if mismatch else None,
        "output_ids": list(range(new_tokens)),
    }
