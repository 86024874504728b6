"""The views of runs on the HTML page (report/html_page.py), one function each, drawn with Plotly from the runs'
records: the headline table, the speedups as a forest plot, acceptance by draft position, accepted tokens per
step, speedup and tau by category, the time of a step beside the cost model's, batch sizes, provenance and two
runs side by side. Every figure is the summaries' own (analysis/stats.py); a view the records have no data for
carries the reason instead of a figure.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import plotly.graph_objects as go
from matplotlib.colors import to_hex
from plotly.subplots import make_subplots

from specbench.analysis.stats import PositionCounts
from specbench.core.engine_names import label
from specbench.core.records import RunResult, StrategySummary
from specbench.methods.names import BASELINE
from specbench.report.comparison import SETTINGS, footer, settings
from specbench.report.plots import SHARES, style

TEMPLATE = "plotly_white"


@dataclass
class View:
    """One section of the page: Plotly figures or an HTML fragment (or both), or the note that says why it is
    empty. `key` is the section's id on the page."""

    key: str
    title: str
    figures: tuple[go.Figure, ...] = ()
    html: str = ""
    note: str = ""

    @property
    def empty(self) -> bool:
        return not self.figures and not self.html


@dataclass
class Entry:
    """A summary as the page shows it: its run and the label that names it in every view."""

    run: RunResult
    summary: StrategySummary
    label: str


def entries(runs: Sequence[RunResult], by_category: bool = False) -> list[Entry]:
    """Every summary of the runs, labelled: the strategy (with its engine where not specbench's), prefixed with its
    run's label when several runs are shown, with its batch size where the run measured several."""
    out = []
    for run in runs:
        summaries = run.by_category if by_category else run.summary
        batched = len({s.batch_size for s in run.summary}) > 1
        for s in summaries:
            name = label(s.strategy, s.engine)
            name = (f"{run.label}/{name}" if len(runs) > 1 else name) + (f" B={s.batch_size}" if batched else "")
            out.append(Entry(run, s, name))
    return out


def colour(strategy: str) -> str:
    """A strategy's colour, the same as in the PNG plots."""
    return to_hex(style(strategy)[0])


def sized(fig: go.Figure, height: int) -> go.Figure:
    fig.update_layout(template=TEMPLATE, height=height, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def number(value: float | None, digits: int = 2) -> str:
    if isinstance(value, int):
        return str(value)
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[tuple[str, float | str | None]]]) -> str:
    """An HTML table; each cell is (text, sort value): the page's script sorts a column by its cells' values."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f'<td data-value="{html.escape(str("" if v is None else v))}">{html.escape(text)}</td>' for text, v in row)
        + "</tr>" for row in rows)
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def noise_verdict(run: RunResult, reasons: bool = True) -> str:
    if run.noise is None:
        return "not checked"
    if not run.noise.noisy:
        return "quiet"
    return "noisy: " + "; ".join(run.noise.reasons) if reasons else "noisy"


def interval_point(name: str, value: float, low: float | None, high: float | None, strategy: str,
                   symbol: str = "circle", note: str = "") -> go.Scatter:
    """One row of a forest plot: a value and, where it has one, its interval."""
    interval = low is not None and high is not None
    return go.Scatter(x=[value], y=[name], mode="markers", name=name, showlegend=False,
                      marker={"color": colour(strategy), "size": 10, "symbol": symbol},
                      error_x={"type": "data", "symmetric": False, "array": [high - value],
                               "arrayminus": [value - low]} if interval else None,
                      hovertemplate=f"{html.escape(name)}: %{{x:.2f}}x" + (
                          f" [{low:.2f}, {high:.2f}]" if interval else "") + f" {html.escape(note)}<extra></extra>")


# -- the views -------------------------------------------------------------------------------------------------------


def headline(runs: Sequence[RunResult]) -> View:
    shown = entries(runs)
    if not shown:
        return View("headline", "Headline", note="no strategy has a summary yet: the runs hold no measured rows")
    several = len(runs) > 1
    headers = (["run"] if several else []) + ["strategy", "batch", "speedup [95% CI]", "tokens/s", "tau",
                                              "acceptance p1", "draft efficiency", "mismatches", "noise"]
    rows = []
    for e in shown:
        s = e.summary
        baseline = s.strategy == BASELINE
        low, high = s.speedup_ci
        noisy = "~" if e.run.noise and e.run.noise.noisy else ""
        speedup = "1.00x" if baseline else ("-" if s.speedup is None else f"{noisy}{s.speedup:.2f}x" + (
            f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""))
        p1 = (s.acceptance_rate_by_position or [None])[0]
        rows.append(([(e.run.label, e.run.label)] if several else []) + [
            (label(s.strategy, s.engine), s.strategy), (str(s.batch_size), s.batch_size),
            (speedup, 1.0 if baseline else s.speedup), (number(s.tokens_per_s, 1), s.tokens_per_s),
            (number(s.tau), s.tau), ("-" if p1 is None else f"{100 * p1:.0f}%", p1),
            ("-" if s.draft_efficiency is None else f"{100 * s.draft_efficiency:.0f}%", s.draft_efficiency),
            ("-" if baseline else "n/a" if s.mismatches is None else str(s.mismatches), s.mismatches),
            (noise_verdict(e.run, reasons=False), noise_verdict(e.run, reasons=False))])
    legend = ("speedup: tokens/s over ar's on the same prompt, geometric mean over prompts, 95% bootstrap interval; "
              "tau: tokens per target forward, the bonus token included; acceptance p1: drafts whose first token "
              "was accepted / drafts; draft efficiency: accepted / drafted tokens; mismatches: prompts whose greedy "
              "output differs from ar's (n/a when sampling). Click a column's header to sort by it.")
    notes = [f"{line}." for line in footer(runs)]  # noise, too few prompts, skipped prompts
    return View("headline", "Headline", html=table(headers, rows), note=" ".join([legend, *notes]))


def forest(runs: Sequence[RunResult]) -> View:
    shown = [e for e in entries(runs) if e.summary.speedup is not None or e.summary.strategy == BASELINE]
    if not shown:
        return View("forest", "Speedup over ar", note="no speedup: no prompt was measured with both ar and a strategy")
    fig = go.Figure()
    for e in reversed(shown):
        s = e.summary
        baseline = s.strategy == BASELINE
        low, high = s.speedup_ci if not baseline else (None, None)
        fig.add_trace(interval_point(e.label, 1.0 if baseline else s.speedup, low, high, s.strategy,
                                     "diamond" if baseline else "circle"))
    fig.add_vline(x=1.0, line_dash="dash", line_color="black")
    fig.update_xaxes(title="speedup over ar (tokens/s ratio, geometric mean over prompts)")
    fig.update_layout(title="Paired speedup over ar, 95% bootstrap interval (ar at 1)")
    return View("forest", "Speedup over ar", (sized(fig, 160 + 28 * len(shown)),))


def acceptance(runs: Sequence[RunResult]) -> View:
    shown = [e for e in entries(runs) if e.summary.conditional_acceptance_by_position]
    if not shown:
        return View("acceptance", "Acceptance by draft position", note="no drafting strategy has a summary: the "
                    "runs hold ar's rows only, or none")
    fig = make_subplots(1, 2, subplot_titles=("drafts accepting position k / drafts (vLLM's)",
                                              "P(k accepted | k-1 accepted) (the cost model's)"))
    for e in shown:
        s = e.summary
        for col, rates in ((1, s.acceptance_rate_by_position or []), (2, s.conditional_acceptance_by_position)):
            fig.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers", name=e.label,
                                     legendgroup=e.label, showlegend=col == 1, line={"color": colour(s.strategy)}),
                          1, col)
    fig.update_xaxes(title="draft position k", dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    note = "" if all(e.summary.acceptance_rate_by_position for e in shown) else \
        "runs written before the unconditional rate was kept show the conditional one only"
    return View("acceptance", "Acceptance by draft position", (sized(fig, 420),), note=note)


def accepted_histogram(runs: Sequence[RunResult]) -> View:
    fig = go.Figure()
    frames = {run.label: run.frame() for run in runs}
    for e in entries(runs):
        s, frame = e.summary, frames[e.run.label]
        rows = frame[(frame.strategy == s.strategy) & (frame.engine == s.engine) & (frame.batch_size == s.batch_size)]
        if s.strategy == BASELINE or rows.empty:
            continue
        shares = PositionCounts.of(rows).accepted_per_step()
        if len(shares) > 1:
            fig.add_trace(go.Bar(x=list(range(len(shares))), y=shares, name=e.label,
                                 marker_color=colour(s.strategy)))
    if not fig.data:
        return View("histogram", "Accepted tokens per step",
                    note="no drafting strategy's rows: the runs hold ar's rows only, or none")
    fig.update_layout(barmode="group", title="Share of steps accepting exactly j draft tokens (bonus not counted)")
    fig.update_xaxes(title="draft tokens accepted in a step", dtick=1)
    fig.update_yaxes(title="share of steps", range=[0, 1])
    return View("histogram", "Accepted tokens per step", (sized(fig, 380),))


def _winners(values: list[list[float | None]]) -> list[int | None]:
    """Per column, the row of its highest value."""
    winners = []
    for column in zip(*values):
        known = [(v, i) for i, v in enumerate(column) if v is not None]
        winners.append(max(known)[1] if known else None)
    return winners


def categories(runs: Sequence[RunResult]) -> View:
    shown = [e for e in entries(runs, by_category=True) if e.summary.strategy != BASELINE]
    if not shown:
        return View("categories", "Speedup and tau by category",
                    note="no summary per category: the runs hold no drafting strategy's rows by category")
    names = list(dict.fromkeys(e.summary.category for e in shown))
    labels = list(dict.fromkeys(e.label for e in shown))
    fig = make_subplots(1, 2, subplot_titles=("speedup over ar (★ the category's fastest)",
                                              "tau (★ the category's longest)"), horizontal_spacing=0.18)
    for col, figure in ((1, "speedup"), (2, "tau")):
        at = {(e.label, e.summary.category): getattr(e.summary, figure) for e in shown}
        z = [[at.get((name, c)) for c in names] for name in labels]
        best = _winners(z)
        text = [[("★ " if best[j] == i else "") + number(v) for j, v in enumerate(row)] for i, row in enumerate(z)]
        fig.add_trace(go.Heatmap(z=z, x=names, y=labels, text=text, texttemplate="%{text}", colorscale="Viridis",
                                 showscale=False, name=figure,
                                 hovertemplate="%{y}, %{x}: " + figure + " %{z:.2f}<extra></extra>"), 1, col)
    fig.update_yaxes(autorange="reversed")
    return View("categories", "Speedup and tau by category", (sized(fig, 160 + 34 * len(labels)),))


def time_split(runs: Sequence[RunResult]) -> View:
    """Each strategy's time per target step, split as measured, beside the cost model's draft and verify time of
    one step for the same draft shape."""
    parts: dict[str, list[float]] = {part: [] for part, _ in SHARES}
    ys: list[str] = []
    for e in entries(runs):
        s = e.summary
        if not s.tau or not s.new_tokens or any(v is None for v in s.time_shares.values()):
            continue
        step_ms = 1e3 * s.wall_s * s.tau / s.new_tokens
        ys.append(f"{e.label} measured")
        for part, _ in SHARES:
            parts[part].append(step_ms * s.time_shares[part])
        if s.cost_model:
            ys.append(f"{e.label} cost model")
            model = {"draft": s.cost_model.draft_s, "verify": s.cost_model.verify_s}
            for part, _ in SHARES:
                parts[part].append(1e3 * model.get(part, 0.0))
    if not ys:
        return View("time", "Time per step", note="no time split: no summary holds its time shares")
    fig = go.Figure([go.Bar(x=parts[part], y=ys, name=part, orientation="h", marker_color=c) for part, c in SHARES])
    fig.update_layout(barmode="stack", title="Time per target step: measured, and the cost model's prediction")
    fig.update_xaxes(title="milliseconds per step (wall time x share / steps)")
    fig.update_yaxes(autorange="reversed")
    note = ("the cost model predicts a step's draft and verify time from forwards timed separately; prefill and "
            "other (acceptance, cache compaction, bookkeeping) are not modelled")
    if not any(e.summary.cost_model for e in entries(runs)):
        note = "no cost model prediction in these runs (the forwards' costs were not timed): measured time only"
    return View("time", "Time per step", (sized(fig, 160 + 26 * len(ys)),), note=note)


def batch_sizes(runs: Sequence[RunResult]) -> View:
    fig, notes = go.Figure(), []
    for run in runs:
        load = run.load
        if load is None or not load.points:
            notes.append(f"{run.label}: " + (load.note if load and load.note else "no load axis: the run measured "
                                             "batch size 1 only and priced no other"))
            continue
        prefix = f"{run.label}/" if len(runs) > 1 else ""
        for strategy in dict.fromkeys(p.strategy for p in load.points):
            points = sorted((p for p in load.points if p.strategy == strategy), key=lambda p: p.batch_size)
            c = colour(strategy)
            fig.add_trace(go.Scatter(x=[p.batch_size for p in points], y=[p.modelled_speedup for p in points],
                                     mode="lines", line={"dash": "dash", "color": c},
                                     name=f"{prefix}{strategy} modelled"))
            measured = [p for p in points if p.measured_speedup is not None]
            if measured:
                fig.add_trace(go.Scatter(x=[p.batch_size for p in measured],
                                         y=[p.measured_speedup for p in measured], mode="markers",
                                         marker={"color": c, "size": 10}, name=f"{prefix}{strategy} measured"))
    if not fig.data:
        return View("batch", "Batch sizes", note="; ".join(notes))
    fig.add_hline(y=1.0, line_dash="dot", line_color="black")
    fig.update_xaxes(title="batch size", type="log")
    fig.update_yaxes(title="speedup over ar at the same batch size")
    fig.update_layout(title="Speedup against batch size: measured (points) and modelled (dashed)")
    return View("batch", "Batch sizes", (sized(fig, 420),), note="; ".join(notes))


def _duration(run: RunResult) -> str:
    try:
        seconds = (datetime.fromisoformat(run.meta.finished) - datetime.fromisoformat(run.meta.started)).total_seconds()
    except (TypeError, ValueError):
        return "unfinished" if not run.complete else "-"
    return f"{seconds:.0f} s"


def provenance(runs: Sequence[RunResult]) -> View:
    parts = []
    for run in runs:
        env, meta = run.environment, run.meta
        facts = [("directory", str(run.path)), ("status", meta.status), ("model", meta.model), ("suite", meta.suite),
                 ("strategies", ", ".join(meta.strategies)), ("started", meta.started or "-"),
                 ("finished", meta.finished or "-"), ("duration", _duration(run)),
                 ("specbench", f"{meta.specbench_version or env.specbench or '-'} (git {env.git_revision or '-'})"),
                 ("python / torch / transformers", f"{env.python or '-'} / {env.torch or '-'} / "
                                                   f"{env.transformers or '-'}"),
                 ("platform", env.platform or "-"), ("CPU", f"{env.cpu or '-'} ({env.cpu_count or '-'} CPUs, "
                                                         f"{env.torch_threads or '-'} torch threads)"),
                 ("GPU", env.cuda or "none"), ("GPU profile projected onto", meta.gpu_profile or "none"),
                 ("seed", str(run.config.get("seed", "-"))), ("noise", noise_verdict(run)),
                 ("settings", json.dumps(run.config, sort_keys=True)),
                 ("drafters", json.dumps(env.drafters, sort_keys=True) if env.drafters else "-")]
        facts += [("note", note) for note in run.notes]
        if run.skipped_prompts:
            facts.append(("skipped prompts", ", ".join(run.skipped_prompts)))
        body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
        parts.append(f'<h3>{html.escape(run.label)}</h3><table class="facts">{body}</table>')
    return View("provenance", "Provenance", html="".join(parts))


COMPARED = (("speedup", "x"), ("tokens_per_s", "ratio"), ("tau", "ratio"), ("draft_efficiency", "diff"),
            ("mismatches", "diff"))


def _change(before: float | None, after: float | None, how: str) -> tuple[str, float | None]:
    if before is None or after is None:
        return "-", None
    if how == "diff":
        return f"{after - before:+.2f}", after - before
    ratio = after / before if before else None
    return ("-", None) if ratio is None else (f"{100 * (ratio - 1):+.1f}%", ratio)


def side_by_side(runs: Sequence[RunResult]) -> View:
    title = "Two runs side by side"
    if len(runs) != 2:
        return View("compare", title, note=f"needs exactly two runs (a before and an after); {len(runs)} given")
    before, after = runs
    if settings(before) != settings(after):
        differ = [k for k, a, b in zip(SETTINGS, settings(before), settings(after)) if a != b]
        return View("compare", title, note=f"left out: {before.label} and {after.label} differ in "
                    f"{', '.join(differ)}, so their figures are not comparable")
    old = {(s.strategy, s.engine, s.batch_size): s for s in before.summary}
    headers = ["strategy", "batch"] + [f"{figure} {which}" for figure, _ in COMPARED
                                       for which in ("before", "after", "change")]
    rows = []
    for s in after.summary:
        b = old.get((s.strategy, s.engine, s.batch_size))
        if b is None:
            continue
        row = [(label(s.strategy, s.engine), s.strategy), (str(s.batch_size), s.batch_size)]
        for figure, how in COMPARED:
            x, y = getattr(b, figure), getattr(s, figure)
            row += [(number(x), x), (number(y), y), _change(x, y, how)]
        rows.append(row)
    if not rows:
        return View("compare", title, note=f"left out: {before.label} and {after.label} share no strategy")
    return View("compare", title, html=table(headers, rows),
                note=f"before: {before.label}; after: {after.label}. Change: speedup, tokens/s and tau as a "
                     "percentage of before; draft efficiency and mismatches as a difference")


RUN_VIEWS = (headline, forest, acceptance, accepted_histogram, categories, time_split, batch_sizes, provenance,
             side_by_side)
"""The views of runs, in the page's order."""
