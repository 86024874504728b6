"""The views of serve sweeps and tune studies on the HTML page (report/html_page.py), drawn with Plotly from their
records: a serve run's latencies, goodput and errors against its load per strategy, with where each stops paying
and the samples each percentile rests on; a study's trials in order, its best knobs beside the defaults, each
knob's importance and the held-out check (the lines `specbench tune` prints).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.core.records import StudyRecord
from specbench.core.records.serve_records import Percentiles, ServeLevel, ServeResult
from specbench.methods.names import BASELINE
from specbench.report.html_views import View, colour, sized, table
from specbench.report.tune_report import PARAM_HEADERS, params_rows, study_lines


@dataclass
class TrialValue:
    """One finished trial of a study: its number and the value its objective gave."""

    number: int
    value: float


@dataclass
class StudyView:
    """A study as the page shows it: its record and its finished trials in order (empty where its storage could
    not be read)."""

    record: StudyRecord
    trials: list[TrialValue] = field(default_factory=list)


def _load(level: ServeLevel) -> float | None:
    return level.concurrency if level.concurrency is not None else level.request_rate


def _p50(figures: Percentiles | None) -> str:
    return "-" if figures is None or figures.p50 is None else f"{figures.p50:.1f} (n={figures.n})"


def _serve_figure(levels: list[tuple[str, ServeLevel]], closed: bool) -> go.Figure:
    goodput = any(e.goodput_req_s is not None for _, e in levels)
    panels = (("TTFT p50 (ms)", lambda e: e.ttft_ms.p50), ("TPOT p50 (ms)", lambda e: e.tpot_ms.p50),
              ("TPOT speedup over ar (below 1: stops paying)", lambda e: e.tpot_speedup),
              ("goodput at the SLO (requests/s)" if goodput else "output tokens/s",
               (lambda e: e.goodput_req_s) if goodput else (lambda e: e.output_tok_s)),
              ("error rate", lambda e: e.errors / e.requests if e.requests else None),
              ("requests measured (the percentiles' samples)", lambda e: e.requests))
    fig = make_subplots(2, 3, subplot_titles=[title for title, _ in panels], horizontal_spacing=0.07)
    for name in dict.fromkeys(name for name, _ in levels):
        points = sorted((e for n, e in levels if n == name), key=_load)
        strategy = points[0].strategy
        line = {"color": "black", "dash": "dash"} if strategy == BASELINE else {"color": colour(strategy)}
        for i, (_, figure) in enumerate(panels):
            fig.add_trace(go.Scatter(x=[_load(e) for e in points], y=[figure(e) for e in points], name=name,
                                     mode="lines+markers", line=line, legendgroup=name, showlegend=i == 0),
                          i // 3 + 1, i % 3 + 1)
    fig.add_hline(y=1.0, line_dash="dot", line_color="black", row=1, col=3)
    fig.update_xaxes(title="concurrency (clients, closed loop)" if closed else "request rate (requests/s)",
                     type="log", tickvals=sorted({_load(e) for _, e in levels}))
    return fig


def serve_sweep(serves: Sequence[ServeResult]) -> View:
    title = "Serve sweep"
    levels = [(f"{r.path.name}/{e.strategy}" if len(serves) > 1 else e.strategy, e)
              for r in serves for e in r.levels if _load(e) is not None]
    if not levels:
        return View("serve", title, note="no serve run given (pass a `specbench serve` directory)" if not serves
                    else "the serve runs hold no measured level yet")
    closed = all(e.concurrency is not None for _, e in levels)
    rows = [[(name, name), (e.level, _load(e)), (str(e.requests), e.requests), (str(e.errors), e.errors),
             (_p50(e.ttft_ms), e.ttft_ms.p50), (_p50(e.tpot_ms), e.tpot_ms.p50),
             ("-" if e.tpot_speedup is None else f"{e.tpot_speedup:.2f}x" + (
                 f" [{e.tpot_speedup_ci[0]:.2f}, {e.tpot_speedup_ci[1]:.2f}]"
                 if e.tpot_speedup_ci and None not in e.tpot_speedup_ci else ""), e.tpot_speedup),
             ("yes" if e.complete else "NO", e.complete)] for name, e in levels]
    notes = []
    for r in serves:
        for name, verdict in r.strategies.items():
            if name == BASELINE:
                continue
            if verdict.crossover is not None:
                notes.append(f"{name} stops paying at concurrency {verdict.crossover}")
            elif verdict.undecided:
                notes.append(f"{name}: no verdict at {', '.join(verdict.undecided)} (the interval holds 1)")
            else:
                notes.append(f"{name} pays at every level measured")
            if verdict.errors:
                notes.append(f"{name}: errors at " + ", ".join(f"{k} ({v})" for k, v in verdict.errors.items()))
        notes += r.notes
    headers = ["strategy", "level", "requests", "errors", "TTFT p50 ms (n)", "TPOT p50 ms (n)",
               "TPOT speedup [95% CI]", "complete"]
    return View("serve", title, (sized(_serve_figure(levels, closed), 680),), html=table(headers, rows),
                note="; ".join(notes))


def _study_figure(study: StudyView) -> go.Figure | None:
    record, trials = study.record, study.trials
    importances = record.importances or {}
    if not trials and not importances:
        return None
    fig = make_subplots(1, 2, subplot_titles=("trials in order (line: best so far)", "each knob's importance"))
    if trials:
        maximise = getattr(record, "direction", "maximize") != "minimize"
        best = [max(values) if maximise else min(values)
                for values in ([t.value for t in trials[:i + 1]] for i in range(len(trials)))]
        numbers = [t.number for t in trials]
        fig.add_trace(go.Scatter(x=numbers, y=[t.value for t in trials], mode="markers", name="trial",
                                 marker={"color": colour(record.strategy)}), 1, 1)
        fig.add_trace(go.Scatter(x=numbers, y=best, mode="lines", name="best so far", line={"color": "black"}), 1, 1)
        fig.update_xaxes(title="trial", row=1, col=1)
    if importances:
        fig.add_trace(go.Bar(x=list(importances.values()), y=list(importances), orientation="h", name="importance",
                             marker_color="#7f7f7f"), 1, 2)
    return sized(fig, 380)


def tune_study(studies: Sequence[StudyView]) -> View:
    title = "Tune studies"
    if not studies:
        return View("tune", title, note="no study given (pass a study's JSON record, <out>/tuned/<study>.json)")
    parts, figures, notes = [], [], []
    for study in studies:
        lines, warnings = study_lines(study.record)
        parts.append(f"<h3>{html.escape(lines[0])}</h3>" + "".join(f"<p>{html.escape(x)}</p>" for x in lines[1:])
                     + "".join(f'<p class="warning">{html.escape(w)}</p>' for w in warnings))
        if study.record.best_params is not None:
            parts.append(table(PARAM_HEADERS, [[(c, c) for c in row] for row in params_rows(study.record)]))
        if not study.trials:
            notes.append(f"{study.record.study}: its trials are not shown (storage {study.record.storage} could "
                         "not be read here)")
        figures.append(_study_figure(study))
    return View("tune", title, tuple(f for f in figures if f is not None), html="".join(parts), note="; ".join(notes))
