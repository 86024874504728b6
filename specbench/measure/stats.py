"""Run statistics: paired speedups (geometric mean, bootstrap interval) and per-strategy summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from specbench.measure.cost_model import predict
from specbench.measure.lossless import divergences

BASELINE = "ar"


def geometric_mean(values: Sequence[float] | pd.Series) -> float:
    """Geometric mean of the positive, non-missing values; NaN when there are none."""
    arr = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype=float)
    arr = arr[arr > 0]
    return float(np.exp(np.log(arr).mean())) if arr.size else math.nan


def geometric_mean_ci(ratios: np.ndarray, seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of positive ratios and its percentile-bootstrap interval (scipy)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    centre = float(np.exp(logs.mean()))
    if len(logs) < 2 or np.allclose(logs, logs[0]):
        return centre, centre, centre
    res = bootstrap((logs,), np.mean, confidence_level=confidence, n_resamples=2000, method="percentile",
                    random_state=np.random.default_rng(seed))
    return centre, float(np.exp(res.confidence_interval.low)), float(np.exp(res.confidence_interval.high))


def paired_speedups(rows: pd.DataFrame) -> pd.Series:
    """Per row: its tokens per second over `ar`'s on the same prompt, turn and repeat.

    Per generated token, not per answer: at temperature > 0 (or after a greedy mismatch) the two
    answers differ in length, and an earlier EOS must not read as a speedup.
    """
    key = ["prompt_id", "turn", "repeat"] + (["batch_size"] if "batch_size" in rows else [])  # within a batch size
    rate = rows.new_tokens / rows.wall_s
    base = rate[rows.strategy == BASELINE].set_axis(pd.MultiIndex.from_frame(rows.loc[rows.strategy == BASELINE, key]))
    base_for_row = pd.Series(base.reindex(pd.MultiIndex.from_frame(rows[key])).to_numpy(), index=rows.index)
    return rate / base_for_row


def _position_sums(column: pd.Series) -> np.ndarray:
    width = max((len(v) for v in column), default=0)
    total = np.zeros(width)
    for counts in column:
        total[:len(counts)] += counts
    return total


def acceptance_by_position(accepted: np.ndarray, steps: int) -> list[float]:
    """a_k = P(draft k accepted | draft k - 1 accepted) from how many steps accepted more than k - 1
    drafts (`accepted[k - 1]`); a step that drafted nothing counts as rejected at position 1."""
    reached = np.concatenate([[steps], accepted[:-1]])
    return [float(a / r) for a, r in zip(accepted, reached) if r > 0]


def _safe_div(num: float, den: float) -> float:
    return num / den if den else float("nan")


def summarize_strategy(rows: pd.DataFrame, ar_rows: pd.DataFrame, seed: int = 0) -> dict[str, Any]:
    """One strategy's summary from its per-prompt rows and the baseline's rows of the same run."""
    per_prompt = rows.dropna(subset=["speedup"]).groupby(["prompt_id", "turn"]).speedup.apply(geometric_mean)
    speedup, low, high = geometric_mean_ci(per_prompt.to_numpy(), seed) if len(per_prompt) else (math.nan,) * 3
    steps, wall = rows.steps.sum(), rows.wall_s.sum()
    per_position = acceptance_by_position(_position_sums(rows.accept_by_position), steps)
    first_divergences, margins = divergences(rows)
    summary = {
        "strategy": rows.strategy.iloc[0],
        "prompts": int(rows.groupby(["prompt_id", "turn"]).ngroups),
        "new_tokens": int(rows.new_tokens.sum()),
        "wall_s": float(wall),
        "tokens_per_s": _safe_div(rows.new_tokens.sum(), wall),
        "speedup": speedup,
        "speedup_ci": [low, high],
        "tau": _safe_div(rows.new_tokens.sum(), steps),
        "draft_efficiency": _safe_div(rows.accepted.sum(), rows.drafted.sum()),
        "acceptance_by_position": per_position,
        "mismatches": int(rows.mismatch.sum()),
        "first_divergence": first_divergences,
        "divergence_margin": margins,
        "draft_frac": _safe_div(rows.draft_s.sum(), wall),
        "verify_frac": _safe_div(rows.verify_s.sum(), wall),
        "other_frac": _safe_div(rows.other_s.sum(), wall),
        "prefill_frac": _safe_div(rows.prefill_s.sum(), wall),
        "memory_bytes": int(rows.memory_bytes.max()),
        "peak_mem_bytes": int(rows.peak_mem_bytes.max()),
    }
    ar_step = _safe_div(ar_rows.verify_s.sum() + ar_rows.other_s.sum(), ar_rows.steps.sum())
    if steps and ar_step > 0 and summary["strategy"] != BASELINE:
        summary["cost_model"] = predict(per_position, rows.draft_s.sum() / steps / ar_step,
                                        rows.verify_s.sum() / steps / ar_step, rows.other_s.sum() / steps / ar_step)
    return summary


def summarize(rows: pd.DataFrame, seed: int = 0) -> list[dict[str, Any]]:
    """Summaries of every strategy in a run's rows, `ar` first, in order of appearance."""
    ar_rows = rows[rows.strategy == BASELINE]
    return [summarize_strategy(rows[rows.strategy == name], ar_rows, seed) for name in rows.strategy.unique()]
