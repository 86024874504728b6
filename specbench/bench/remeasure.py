"""Outliers caught and measured again, so that a run never averages a stall into its figures silently.

After the measured part, a prompt is flagged where its seconds per generated token lie above its strategy's
median + k * MAD (analysis/stats.py `outliers`, k the run's `outlier_k`), or where its engine logged a
compilation or a fallback while it decoded (`Row.outlier`, vLLM's log). Each flagged prompt is decoded again,
once, as it was (same prompt, seed and engine); its row becomes the second measurement's, keeping the first
timing (`first_wall_s`) and why it was flagged, so the figures use the second and the summary lists both.

Batch size 1 only: a batched row's time is its batch's share, and its batch ran whole.
"""

from __future__ import annotations

from dataclasses import replace

from specbench.analysis.stats import outliers
from specbench.bench.decode_groups import prompt_seed, run_one
from specbench.bench.measuring import Key, make_row, peak_memory, turn_prompt
from specbench.bench.prepare import PreparedRun
from specbench.core.records import Row, rows_frame
from specbench.methods.names import BASELINE

TIME = "time"  # the cause of a prompt flagged by its time alone


def flagged(rows: list[Row], k: float) -> dict[int, str]:
    """The rows (by index) to measure again, each with its cause: the engine's log line, else TIME. A row
    measured again already is not flagged twice."""
    frame = rows_frame(rows)
    single = frame[frame.batch_size == 1]
    if single.empty:
        return {}
    slow, fresh = outliers(single, k), single.first_wall_s.isna()
    return {int(i): TIME if single.outlier.isna()[i] else str(single.outlier[i])
            for i in single.index[fresh & (slow | single.outlier.notna())]}


def remeasure_outliers(bench: PreparedRun, rows: list[Row], previous: dict[Key, list[int]]) -> list[Row]:
    """`rows` with each flagged one replaced by its measurement again (`previous`: `ar`'s outputs, which
    rebuild a later turn's prompt)."""
    causes = flagged(rows, bench.config.outlier_k)
    items = {item.id: item for item in bench.suite.items}
    strategies = {(s.engine, s.name): s for s in bench.runs}
    ars = {(r.engine, r.prompt_id, r.turn, r.repeat): r.output_ids for r in rows
           if r.strategy == BASELINE and r.batch_size == 1}
    kept = list(rows)
    for index, cause in causes.items():
        row = rows[index]
        item, strategy = items[row.prompt_id], strategies[(row.engine, row.strategy)]
        prompt = turn_prompt(bench, item, row.turn, previous)
        with bench.metrics.measure(strategy.label):
            gen = run_one(bench, strategy, prompt, prompt_seed(bench.config.seed, item, row.turn, row.repeat))
        reference = ars.get((row.engine, row.prompt_id, row.turn, row.repeat)) if bench.sampling.greedy else None
        again = make_row(bench.target.model, strategy, item, row.turn, row.repeat, prompt, gen, reference,
                         peak_memory(bench.target.device), row.order)
        agreement = {f: getattr(row, f) for f in Row.OPTIONAL["engines_agree"]}  # outputs the same, greedy
        kept[index] = replace(again, **agreement, first_wall_s=row.wall_s, outlier=cause)
    return kept
