"""A run's result from its rows: the summaries (per strategy, batch size and category), device
metrics, noise, the --gpu projection and the load axis, written to the run directory with the plots."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from specbench.analysis.cost_table import CostTable
from specbench.analysis.hardware import is_local_gpu
from specbench.analysis.noise import NoiseMonitor
from specbench.analysis.projection import by_batch, workload_shape
from specbench.analysis.projection import project as projection
from specbench.analysis.stats import CostInputs, engine_pairs, paired_speedups, summarise_strategies, transfer
from specbench.bench.modelled_speedup import load_axis
from specbench.bench.prepare import PreparedRun
from specbench.core.engine_names import label
from specbench.core.files import write_atomic
from specbench.core.records import Projection, Row, RunProjection, RunResult, StrategySummary
from specbench.report.batch_plots import write_batch_plots
from specbench.report.plots import write_plots
from specbench.report.run_dir import RunDir


def project(bench: PreparedRun, rows: pd.DataFrame, summary: list[StrategySummary]) -> RunProjection:
    """Each strategy's measured shape on the --gpu profile, at the run's batch size and swept over
    batch sizes (where speculation stops paying there).

    When the profile is the local GPU the figures above are measured and nothing is projected.
    """
    profile = bench.profile
    if is_local_gpu(profile.name):
        return RunProjection(profile.name, projected=False, note="measured on this GPU")
    by_name = {s.name: s for s in bench.strategies}
    for result in summary:
        part = rows[rows.strategy == result.strategy]
        shape = workload_shape(bench.target.model, by_name[result.strategy].drafter, part)
        result.projection = Projection(**projection(shape, profile), by_batch=by_batch(shape, profile))
    return RunProjection(profile.name, projected=True)


def summarise_run(bench: PreparedRun, result: RunResult, noise: NoiseMonitor | None, costs: CostInputs | None,
                  priced: CostTable | None) -> None:
    """The result's summaries (per strategy and batch size, per category), device metrics, noise,
    projection and load axis, from its rows (which gain their paired speedups)."""
    rows = result.frame()
    rows["speedup"] = paired_speedups(rows)
    for row, speedup in zip(result.rows, rows.speedup):
        row.speedup = None if math.isnan(speedup) else float(speedup)
    for batch_size, part in rows.groupby("batch_size", sort=True):
        # the cost model predicts batch size 1 (analysis/cost_model.py); the load axis models every batch size
        at = {"costs": costs if batch_size == 1 else None}
        for summary in summarise_strategies(part, bench.config.seed, **at):
            metrics = bench.metrics.summary(label(summary.strategy, summary.engine), summary.new_tokens)
            result.summary.append(replace(summary, batch_size=int(batch_size), **metrics))
        result.by_category += [replace(s, batch_size=int(batch_size))
                               for s in summarise_strategies(part, bench.config.seed, by="category", **at)]
    reference = bench.plan.reference
    ratios = transfer(result.summary, reference)
    for summary in result.summary:
        if summary.engine != reference:
            summary.transfer = ratios.get((summary.engine, summary.strategy, summary.batch_size))
    result.engine_pairs = engine_pairs(rows, result.summary, bench.sampling.greedy)
    own = rows[rows.engine == reference]  # the noise check, projection and load axis read the reference engine
    own_summary = [s for s in result.summary if s.engine == reference]
    smallest = int(own.batch_size.min())
    first = own[own.batch_size == smallest]
    if noise is not None:
        result.noise = noise.summary(first)
    if bench.profile:
        result.projection = project(bench, first, [s for s in own_summary if s.batch_size == smallest])
    result.load = load_axis(bench.strategies, own, own_summary, priced)


def finish(bench: PreparedRun, run: RunDir, rows: list[Row], complete: bool, noise: NoiseMonitor | None,
           costs: CostInputs | None, priced: CostTable | None) -> RunResult:
    """The run's result from every row measured (those of an interrupted run included), written to its
    directory with the plots; `priced` is the cost table the load axis prices with."""
    result = RunResult(run.path, replace(run.meta, status="complete" if complete else "incomplete"), run.config,
                       run.environment, rows, [], skipped_prompts=bench.skipped, notes=bench.notes,
                       engines=[r for b in bench.backends.values() if not (r := b.report()).empty],
                       nvml_series=bench.metrics.series_frame().to_dict("records"), warmup=bench.warmups)
    if rows:
        summarise_run(bench, result, noise, costs, priced)
    run.finish(result)
    if rows:
        write_plots([result], run.path)
        if result.load.modelled:
            write_atomic(run.path / "draft_schedule.toml", result.load.schedule_toml)
        write_batch_plots(result, priced if result.load.modelled else None)
    return result
