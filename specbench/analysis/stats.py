"""Run statistics, the one home of every figure: paired speedups (per generated token, geometric mean
over prompts, bootstrap interval) and the per-strategy (and per-category) summaries that tables,
plots, tune and recommend render or consume.

The figures, each named for what it is:
- speedup: per (prompt, turn, repeat), the strategy's tokens per second over `ar`'s on the same
  prompt, turn and repeat; the geometric mean over repeats, then over prompts; a 95% percentile
  bootstrap interval over prompts.
- tau: tokens committed per target forward, the bonus token included (1 for `ar`).
- acceptance_rate_by_position: drafts whose position k was accepted / drafts (a draft: a verify step
  that carried at least one draft token), the per-position rate vLLM (its `vllm:spec_decode_*`
  counters, `vllm bench serve`) and AIPerf report: unconditional, non-increasing in k.
- conditional_acceptance_by_position: a_k = P(draft k accepted | draft k - 1 accepted) over all steps
  (a step that drafted nothing is rejected at position 1), whose running products give tau (the cost
  model's form).
- draft_efficiency: accepted draft tokens / drafted tokens, every tree node counted, so a wide tree
  shows what it wastes.
- time_shares: prefill, draft, verify and other (acceptance, cache compaction, bookkeeping) as shares
  of the measured time, summing to 1.
- memory_bytes: what the strategy needs (analysis/memory.py); peak_mem_bytes: the process's peak.
- cost_model: the speedup predicted from tau, the draft shape and separately timed forwards
  (analysis/cost_model.py), and measured / predicted.
- outliers: a prompt whose seconds per generated token lie above median + k * MAD (the scaled MAD,
  1.4826 times the raw one) of its strategy's prompts is measured again (bench/remeasure.py); the
  figures above use the second measurement, and the summary lists both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.stats import bootstrap, median_abs_deviation

from specbench.analysis.cost_model import StepShape, predict
from specbench.analysis.cost_table import CostTable
from specbench.analysis.lossless import divergences, first_divergence
from specbench.core.engine_names import SPECBENCH, label
from specbench.core.records import EngineAgreement, EnginePair, Outlier, StrategySummary
from specbench.methods.names import BASELINE

PROMPT = ["prompt_id", "turn"]
PAIR = ["prompt_id", "turn", "repeat"]
SHARES = ("prefill", "draft", "verify", "other")
STRATEGY = ["engine", "strategy", "batch_size"]
MAD_FLOOR = 0.05  # the scaled MAD counted as at least this share of the median: near-equal times flag no prompt
OUTLIER_ROWS = 3  # a strategy's rows below this have no median to stand out from


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
    # batched runs pair within a batch size, and each engine's strategies with its own `ar`
    pair = PAIR + [c for c in ("batch_size", "engine") if c in rows]
    rate = rows.new_tokens / rows.wall_s
    ar = rows.strategy == BASELINE
    base = rate[ar].set_axis(pd.MultiIndex.from_frame(rows.loc[ar, pair]))
    return rate / base.reindex(pd.MultiIndex.from_frame(rows[pair])).to_numpy()


def outlier_threshold(seconds_per_token: np.ndarray, k: float) -> float:
    """median + k * MAD of a strategy's seconds per token (MAD scaled by 1.4826, the standard deviation's
    estimate under a normal law, and at least MAD_FLOOR of the median)."""
    median = float(np.median(seconds_per_token))
    return median + k * max(float(median_abs_deviation(seconds_per_token, scale="normal")), MAD_FLOOR * median)


def outliers(rows: pd.DataFrame, k: float) -> pd.Series:
    """Per row: whether its seconds per generated token lie above its strategy's outlier threshold (each
    engine's strategy at each batch size on its own; one with fewer than OUTLIER_ROWS rows flags none)."""
    per_token = rows.wall_s / rows.new_tokens.clip(lower=1)
    limit = per_token.groupby([rows[c] for c in STRATEGY]).transform(
        lambda v: outlier_threshold(v.to_numpy(), k) if len(v) >= OUTLIER_ROWS else math.inf)
    return per_token > limit


def unflagged_excess(rows: pd.DataFrame) -> dict[str, float]:
    """Per strategy (its label, `ngram@vllm`): the largest seconds per token of a prompt not measured again over
    the strategy's median, at batch size 1; what a stall left unflagged would show."""
    single = rows[rows.batch_size == 1]
    per_token = single.wall_s / single.new_tokens.clip(lower=1)
    kept = single.first_wall_s.isna() if "first_wall_s" in single else pd.Series(True, index=single.index)
    out = {}
    for (engine, name), times in per_token.groupby([single.engine.fillna(SPECBENCH), single.strategy]):
        out[label(name, engine)] = float(times[kept[times.index]].max() / times.median())
    return out


def run_spread(values: Sequence[float]) -> float:
    """A figure's spread across runs: (max - min) / median (0 for one run)."""
    return float((max(values) - min(values)) / np.median(values))


def measured_again(rows: pd.DataFrame) -> list[Outlier] | None:
    """The strategy's prompts measured again, with both timings; None where none was."""
    flagged = rows[rows.first_wall_s.notna()] if "first_wall_s" in rows else rows.iloc[:0]
    return [Outlier(r.prompt_id, int(r.turn), int(r.repeat), float(r.first_wall_s), float(r.wall_s), str(r.outlier))
            for r in flagged.itertuples()] or None


@dataclass(frozen=True)
class PositionCounts:
    """The counts both per-position rates derive from, as vLLM's spec-decode metrics keep them."""

    accepted: np.ndarray  # [k - 1]: steps that accepted position k (vLLM's num_accepted_tokens_per_pos)
    drafts: int  # steps that carried at least one draft token (vLLM's num_drafts)
    steps: int  # every verify step, those that drafted nothing included

    @classmethod
    def of(cls, rows: pd.DataFrame) -> PositionCounts:
        # rows from before drafts were counted: every step as a draft, as their conditional figure counted them
        drafts = rows.drafts.fillna(rows.steps) if "drafts" in rows else rows.steps
        return cls(position_sums(rows.accept_by_position), int(drafts.sum()), int(rows.steps.sum()))

    def rates(self) -> list[float]:
        """Unconditional: position k accepted / drafts."""
        return [float(a / self.drafts) for a in self.accepted] if self.drafts else []

    def conditional(self) -> list[float]:
        """a_k = P(position k accepted | position k - 1 accepted); a step that drafted nothing counts as
        rejected at position 1."""
        reached = np.concatenate([[self.steps], self.accepted[:-1]])
        return [float(a / r) for a, r in zip(self.accepted, reached) if r > 0]

    def accepted_per_step(self) -> list[float]:
        """[j]: the share of steps that accepted exactly j draft tokens (the bonus token not counted); a step that
        accepted position k accepted every position before it."""
        if not self.steps:
            return []
        reached = np.concatenate([[self.steps], self.accepted])
        return [float(n / self.steps) for n in reached - np.append(self.accepted, 0)]


def position_sums(column: pd.Series) -> np.ndarray:
    """Element-wise sums of per-row count lists of different lengths."""
    width = max((len(v) for v in column), default=0)
    total = np.zeros(width)
    for counts in column:
        total[:len(counts)] += counts
    return total


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


@dataclass(frozen=True)
class CostInputs:
    """What the cost model needs beside the rows: each engine's cost table, and each strategy's key in them."""

    tables: dict[str, CostTable]  # engine -> the table its strategies are priced with
    drafter_keys: dict[str, str]  # strategy name -> its proposals' key in the tables


def tau(rows: pd.DataFrame) -> float | None:
    """Tokens committed per target forward over the rows, the bonus token included."""
    return _ratio(rows.new_tokens.sum(), rows.steps.sum())


def step_shape(rows: pd.DataFrame) -> StepShape:
    steps = rows.steps.sum()
    return StepShape(tau=tau(rows), verified=rows.verified.sum() / steps,
                     budget=rows.budget.sum() / steps,
                     context=float((rows.prompt_tokens + rows.new_tokens / 2).mean()),
                     tree=bool(rows.tree_steps.sum() > 0))


def _figure(value: float) -> float | None:
    """NaN (no pairs to compute it from) is no figure."""
    return None if math.isnan(value) else value


def summarise_strategy(rows: pd.DataFrame, seed: int = 0, costs: CostInputs | None = None) -> StrategySummary:
    """One strategy's summary from its rows (which carry their paired `speedup`)."""
    name = rows.strategy.iloc[0]
    engine = rows.engine.iloc[0] if "engine" in rows else SPECBENCH
    per_prompt = rows.dropna(subset=["speedup"]).groupby(PROMPT).speedup.apply(geometric_mean)
    speedup, low, high = geometric_mean_ci(per_prompt.to_numpy(), seed) if len(per_prompt) else (math.nan,) * 3
    steps, new_tokens = int(rows.steps.sum()), int(rows.new_tokens.sum())
    checked = rows.mismatch.notna().all()
    first_divergences, margins = divergences(rows)
    times = {part: float(rows[f"{part}_s"].sum()) for part in SHARES}
    total = sum(times.values())
    counts = PositionCounts.of(rows)
    summary = StrategySummary(
        strategy=name,
        engine=engine,
        prompts=int(rows.groupby(PROMPT).ngroups),
        new_tokens=new_tokens,
        wall_s=float(rows.wall_s.sum()),
        tokens_per_s=_ratio(new_tokens, rows.wall_s.sum()),
        speedup=_figure(speedup),
        speedup_ci=[_figure(low), _figure(high)],
        tau=tau(rows),
        # drafted, never accepted: position 1 at 0
        acceptance_rate_by_position=counts.rates() or ([0.0] if rows.drafted.sum() else []),
        conditional_acceptance_by_position=counts.conditional() or ([0.0] if rows.drafted.sum() else []),
        draft_efficiency=_ratio(rows.accepted.sum(), rows.drafted.sum()),
        mismatches=int(rows.mismatch.astype(bool).sum()) if checked else None,
        first_divergence=first_divergences,
        divergence_margin=margins,
        time_shares={part: times[part] / total if total else None for part in SHARES},
        memory_bytes=int(rows.memory_bytes.max()),
        peak_mem_bytes=int(rows.peak_mem_bytes.max()),
        outliers=measured_again(rows),
    )
    if "engines_agree" in rows and rows.engines_agree.notna().any():
        summary.engine_agreement = engine_agreement(rows)
    if costs is not None and engine in costs.tables and name != BASELINE and name in costs.drafter_keys and steps:
        model = predict(step_shape(rows), costs.tables[engine], costs.drafter_keys[name])
        summary.cost_model = replace(model, measured_over_predicted=speedup / model.predicted_speedup)
    return summary


def summarise_strategies(rows: pd.DataFrame, seed: int = 0, by: str | None = None,
                         costs: CostInputs | None = None) -> list[StrategySummary]:
    """Summaries of every strategy in a run's rows, in order of appearance with `ar` first; with
    `by="category"` one per strategy and category (the category named in each)."""
    if "speedup" not in rows or rows.speedup.isna().all():
        rows = rows.assign(speedup=paired_speedups(rows))
    # a row that names no engine is specbench's (runs from before there was a second engine)
    rows = rows.assign(engine=rows.engine.fillna(SPECBENCH) if "engine" in rows else SPECBENCH)
    keys = list(dict.fromkeys(zip(rows.engine, rows.strategy)))  # (engine, strategy) in order of appearance
    # each engine's `ar` first, specbench's first
    keys = sorted(keys, key=lambda k: (k[0] != SPECBENCH, k[1] != BASELINE))

    def part_of(frame: pd.DataFrame, key: tuple[str, str]) -> pd.DataFrame:
        return frame[(frame.engine == key[0]) & (frame.strategy == key[1])]

    if by is None:
        return [summarise_strategy(part_of(rows, key), seed, costs) for key in keys]
    out = []
    for value, group in rows.groupby(by, sort=True):
        for key in keys:
            part = part_of(group, key)
            if len(part):
                out.append(replace(summarise_strategy(part, seed, costs), **{by: value}))
    return out


def engine_agreement(rows: pd.DataFrame) -> EngineAgreement:
    """Another engine's `ar` rows against specbench's: prompts that agree token for token, and where the others part."""
    checked = rows[rows.engines_agree.notna()]
    parted = checked[~checked.engines_agree.astype(bool)]
    return EngineAgreement(len(checked), int(checked.engines_agree.astype(bool).sum()),
                           [int(v) for v in parted.engines_first_divergence],
                           [None if pd.isna(v) else float(v) for v in parted.engines_divergence_margin])


def transfer(summaries: list[StrategySummary], reference: str = SPECBENCH) -> dict[tuple[str, str, int], float]:
    """(engine, strategy, batch size) -> the strategy's speedup in that engine over its speedup in `reference`,
    where both engines ran it."""
    speedups = {(s.engine, s.strategy, s.batch_size): s.speedup for s in summaries
                if s.strategy != BASELINE and s.speedup is not None}
    return {(engine, name, batch): value / own for (engine, name, batch), value in speedups.items()
            if engine != reference and (own := speedups.get((reference, name, batch)))}


def engine_pairs(rows: pd.DataFrame, summaries: list[StrategySummary], greedy: bool) -> list[EnginePair]:
    """Every pair of engines of a run, the earlier in run order the reference: how many greedy `ar` outputs
    agree token for token (and where the others part), and the transfer of each strategy both ran."""
    engines = list(dict.fromkeys(s.engine for s in summaries))
    ar = rows[(rows.strategy == BASELINE) & (rows.batch_size == 1)] if greedy else rows.iloc[:0]
    outputs = {engine: {(r.prompt_id, r.turn, r.repeat): list(r.output_ids) for r in part.itertuples()}
               for engine, part in ar.groupby("engine")}
    pairs = []
    for index, reference in enumerate(engines):
        ratios = transfer(summaries, reference)
        for engine in engines[index + 1:]:
            mine, theirs = outputs.get(reference, {}), outputs.get(engine, {})
            shared = [key for key in mine if key in theirs]
            parted = [first for key in shared if (first := first_divergence(theirs[key], mine[key])) is not None]
            pairs.append(EnginePair(reference, engine, len(shared), len(shared) - len(parted), parted,
                                    {name: ratio for (e, name, batch), ratio in ratios.items()
                                     if e == engine and batch == 1}))
    return pairs
