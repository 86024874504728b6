"""What `specbench tune` prints: per study the best trial, its gain over the defaults on the tuning and the
held-out prompts, the parameters beside their defaults with their importance; with several strategies,
their ranking. A rich renderable on a terminal, Markdown text when piped."""

from __future__ import annotations

import math
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specbench.core.markdown import markdown_table
from specbench.core.records import ServedStudy, StudyRecord
from specbench.core.records.study_records import Gain, Holdout, Speedups

if TYPE_CHECKING:
    from specbench.tuning.trials import TuneReport


def _x(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}x"


def _ci(figure: Speedups | Gain | None) -> str:
    value, (low, high) = astuple(figure)[:2] if figure else (None, (None, None))  # the figure and its interval
    if value is None:
        return "n/a"
    return _x(value) + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def study_lines(record: StudyRecord) -> tuple[list[str], list[str]]:
    """(lines of text, warnings) describing one study."""
    if isinstance(record, ServedStudy):
        return served_lines(record)
    t = record.trials
    lines = [f"{record.strategy}: study {record.study}, speedup over ar {record.label}",
             f"trials: {t.counted} ({t.complete} complete, {t.pruned} pruned, {t.failed} failed"
             + (f", {t.infeasible} not fitting the GPU's memory" if t.infeasible else "") + ")"
             + (f"; pruning skipped {t.pruning.prompts_skipped} of {t.pruning.prompts_of_pruned_trials} "
                "prompt runs of the pruned trials" if t.pruned else "")]
    warnings = [f"trial {f.number} failed: {f.reason}" for f in t.failures]
    if record.best_value is None:
        return lines + [f"no best configuration: {record.note or ''}"], warnings
    gain, holdout = record.gain, record.holdout or Holdout()
    defaults = record.defaults
    best = f"best trial {record.best_trial} on {record.prompts['tuning']} tuning prompts: {_ci(record.tuning)}"
    if defaults and gain and gain.tuning:
        best += f"; defaults {_x(defaults.value)}, gain {_ci(gain.tuning)}"
    lines.append(best)
    lines.append(f"held out ({record.prompts['holdout']} prompts): tuned {_ci(holdout.tuned)}, "
                 f"defaults {_ci(holdout.defaults)}, gain {_ci(gain.holdout if gain else None)}")
    warnings += [f"held-out check: {f}" for f in holdout.failures]
    if len(record.objectives) > 1:
        lines.append(f"Pareto front: {len(record.pareto)} trials (speedup against memory); the TOML holds the "
                     "fastest")
    lines += config_lines(record)
    if record.engines_file:
        lines.append(f"vLLM / SGLang translation (not a measurement): {record.engines_file}")
    if record.plots:
        lines.append("plots: " + ", ".join(record.plots))
    return lines, warnings


def served_lines(record: ServedStudy) -> tuple[list[str], list[str]]:
    """(lines of text, warnings) describing a study at a load (tuning/serve_study.py)."""
    t, unit = record.trials, record.unit

    def figure(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3g} {unit}"

    lines = [f"{record.strategy}: study {record.study}, {record.label}",
             f"trials: {t.counted} ({t.complete} complete, {t.failed} failed); server logs under "
             f"{record.logs}"]
    warnings = [f"trial {f.number} failed: {f.reason}" for f in t.failures]
    if record.best_value is None:
        return lines + [f"no best configuration: {record.note or ''}"], warnings
    defaults = record.defaults.value if record.defaults else None
    ar = getattr(record.baseline, record.objective) if record.baseline else None
    lines.append(f"best trial {record.best_trial}: {figure(record.best_value)}; defaults {figure(defaults)}; "
                 f"ar {figure(ar)}; TPOT speedup over ar {_x(record.best.tpot_speedup)}")
    return lines + config_lines(record), warnings


def config_lines(record: StudyRecord) -> list[str]:
    """Where the best configuration went: a run config, and vLLM's speculative config where vLLM measured it."""
    lines = [f"tuned config: {record.toml}  (specbench run --config {record.toml})"]
    if record.vllm_config:
        lines.append(f"vLLM speculative config, as measured: {record.vllm_config}  "
                     f"(vllm serve MODEL --speculative-config \"$(cat {record.vllm_config})\")")
    return lines


def params_rows(record: StudyRecord) -> list[list[str]]:
    defaults = record.defaults.params if record.defaults else {}
    importance = record.importances or {}
    names = list(record.best_params) + [n for n in defaults if n not in record.best_params]
    return [[name, _value(record.best_params.get(name)), _value(defaults.get(name)),
             f"{importance[name]:.2f}" if name in importance else "-"] for name in names]


PARAM_HEADERS = ["parameter", "tuned", "default", "importance"]
RANK_HEADERS = ["rank", "strategy", "tuned (held out)", "defaults (held out)", "gain", "tuning"]


def rank_rows(report: TuneReport) -> list[list[str]]:
    return [[str(i + 1), r["strategy"], _x(r["tuned"]), _x(r["defaults"]), _x(r["gain"]), _x(r["tuning"])]
            for i, r in enumerate(report.ranking)]


def render_markdown(report: TuneReport) -> str:
    parts = []
    for record in report.studies:
        lines, warnings = study_lines(record)
        parts.append("\n".join(lines + [f"WARNING: {w}" for w in warnings]))
        if record.best_value is not None:
            parts.append(markdown_table(PARAM_HEADERS, params_rows(record)))
    if report.ranking:
        parts.append(f"ranking ({report.ranking[0]['label']}):\n" + markdown_table(RANK_HEADERS, rank_rows(report)))
    return "\n\n".join(parts) + "\n"


def _table(headers: list[str], rows: list[list[str]], title: str | None = None) -> Table:
    table = Table(*headers, title=title, title_justify="left")
    for row in rows:
        table.add_row(*row)
    return table


def render_rich(report: TuneReport) -> Group:
    items: list[Any] = []
    for record in report.studies:
        lines, warnings = study_lines(record)
        items.append(Text(lines[0], style="bold"))
        items += [Text(line) for line in lines[1:]] + [Text(f"WARNING: {w}", style="bold red") for w in warnings]
        if record.best_value is not None:
            items.append(_table(PARAM_HEADERS, params_rows(record)))
    if report.ranking:
        items.append(_table(RANK_HEADERS, rank_rows(report), f"ranking ({report.ranking[0]['label']})"))
    return Group(*items)
