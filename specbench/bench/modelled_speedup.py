"""A run's load axis: the modelled speedup at every batch size of the cost table beside the measured
one, the batch size where each strategy stops paying, and the best draft length per batch size.

The draft shape of a strategy (per-position acceptance, draft sizes, context) is taken at the run's
smallest batch size: acceptance does not depend on the batch (greedy outputs are the same at every
batch size). Costs come from the stored cost table (`specbench costs`); a drafter the table lacks
(other knobs) has its proposals timed before the run measures (`time_proposals`), which takes
seconds, and is stored for the next run.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.analysis.batch_model import DraftShape, best_caps, modelled, stops_paying
from specbench.analysis.cost_table import CostTable, load_table
from specbench.analysis.stats import position_sums
from specbench.bench.cost_timing import drafter_context, drafter_key, table_key, time_drafters
from specbench.core.errors import SpecbenchError
from specbench.core.records import LoadAxis, LoadPoint, ModelledSpeedup, StrategySummary
from specbench.methods.build import Strategy
from specbench.methods.draft_schedule import schedule_entry, schedule_toml, vllm_config
from specbench.methods.registry import vllm_method

NO_TABLE = ("no cost table for this model and device: `specbench costs` measures one, and the modelled "
            "speedup at each batch size comes from it")


def time_proposals(target, strategies: list[Strategy], out_dir: str | Path) -> CostTable | None:
    """The table the load axis prices with: the stored one, with the proposals of the drafters it lacks
    timed now (and stored); None without a table (`specbench costs` measures one). The entries timed
    now are used by this run even on a busy machine: only a later read leaves untrusted entries out."""
    table = load_table(out_dir, table_key(target.model))
    if not table.target:
        return None
    return time_drafters(table, target.model, [s for s in strategies if s.drafter is not None],
                         partial(drafter_context, target), out_dir)


def draft_shape(strategy: Strategy, rows: pd.DataFrame, result: StrategySummary) -> DraftShape:
    """What the rows of one strategy at one batch size measured, independent of the batch size: a
    sequence's steps and tokens are too (each decodes what it decodes alone), in the order the run
    batches them (turn by turn, in suite order)."""
    context = float((rows.prompt_tokens + rows.new_tokens / 2).mean())
    steps_by_drafted = position_sums(rows.steps_by_drafted)
    ordered = rows.sort_values(["turn", "repeat"], kind="stable")
    return DraftShape.measured(result.conditional_acceptance_by_position, steps_by_drafted, context,
                               drafter_key(strategy), rows.budget.sum() / rows.steps.sum(), strategy.tree,
                               list(zip(ordered.steps, ordered.new_tokens)))


def load_axis(strategies: list[Strategy], rows: pd.DataFrame, summary: list[StrategySummary],
              table: CostTable | None) -> LoadAxis:
    """Modelled figures beside the measured ones, priced with `table` (`time_proposals`); each measured
    summary gains a `modelled` entry."""
    if table is None:
        return LoadAxis(note=NO_TABLE)
    try:
        return modelled_axis(table, strategies, rows, summary)
    except (KeyError, SpecbenchError) as missing:  # stored entries timed on a busy machine are left out
        return LoadAxis(note=f"the load axis is not modelled: {missing.args[0]} (cost entries timed on a busy "
                             "machine are not trusted when read back: `specbench costs` on a quiet machine times "
                             "them again)")


def modelled_axis(table: CostTable, strategies: list[Strategy], rows: pd.DataFrame,
                  summary: list[StrategySummary]) -> LoadAxis:
    first = int(rows.batch_size.min())
    drafting = [s for s in strategies if s.drafter is not None]
    sizes = table.batch_sizes()
    points, stops, schedules = [], {}, {}
    for strategy in drafting:
        measured = {r.batch_size: r for r in summary if r.strategy == strategy.name}
        part = rows[(rows.strategy == strategy.name) & (rows.batch_size == first)]
        shape = draft_shape(strategy, part, measured[first])
        sweep = [modelled(table, shape, b) for b in sizes]
        full = replace(shape, sequences=())
        for point in sweep:
            result = measured.get(point["batch_size"])
            if result is not None:
                result.modelled = ModelledSpeedup.from_dict(point, "a modelled point")
            points.append(point_row(strategy.name, point, result,
                                    continuous_speedup=modelled(table, full, point["batch_size"])["speedup"],
                                    measured_rows=active_rows(rows[(rows.strategy == strategy.name)
                                                                   & (rows.batch_size == point["batch_size"])])))
        measured_points = [{"batch_size": b, "speedup": r.speedup} for b, r in sorted(measured.items())]
        stops[strategy.name] = {"measured": stops_paying(measured_points), "modelled": stops_paying(sweep),
                                "measured_up_to": max(measured), "modelled_up_to": sizes[-1]}
        schedules[strategy.name] = best_caps(table, shape, sizes)
    entries = {name: schedule_entry(best) for name, best in schedules.items()}
    return LoadAxis(cost_table=table.key, batch_sizes=sizes, points=points, stops_paying=stops, schedule=schedules,
                    schedule_toml=schedule_toml(entries, "this run's acceptance and its cost table"),
                    vllm={name: form for name, entry in entries.items()
                          if (form := vllm_config(vllm_method(name), entry))})


def point_row(strategy: str, point: dict[str, Any], measured: StrategySummary | None,
              **rest: float | None) -> LoadPoint:
    """One strategy at one batch size: the modelled speedup, and the measured one where it ran."""
    speedup = measured.speedup if measured else None
    return LoadPoint(strategy=strategy, batch_size=point["batch_size"], modelled_speedup=point["speedup"],
                     measured_speedup=speedup, measured_over_modelled=speedup / point["speedup"] if speedup else None,
                     modelled_tokens_per_s=point["tokens_per_s"], block=point["block"], modelled_rows=point["rows"],
                     **rest)


def active_rows(rows: pd.DataFrame) -> float | None:
    """The mean sequences active per batched step the rows of one batch size ran (None: it did not run):
    a sequence is active in each of its steps, and each of a batch's `batch_rows` rows holds its steps."""
    if rows.empty:
        return None
    if int(rows.batch_size.iloc[0]) == 1:
        return 1.0
    return float(rows.steps.sum() / (rows.batch_steps / rows.batch_rows).sum())
