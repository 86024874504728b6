"""The recommendation on the HTML page (report/html_page.py): the answer and what it rests on, the alternatives
with why each lost, the evidence's candidates with their intervals (a forest plot, as the runs' speedups), and
the decision path taken through the evidence and the prior (the tree `specbench recommend --explain` prints)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from specbench.core.engine_names import label
from specbench.report.html_views import View, interval_point, sized, table
from specbench.report.recommend_report import (
    ALTERNATIVE_HEADERS,
    Node,
    alternatives_rows,
    explain_nodes,
    summary_lines,
)

if TYPE_CHECKING:
    from specbench.recommender.recommendation import Recommendation


def _tree(node: Node) -> str:
    text, children = node
    inner = "".join(_tree(child) for child in children)
    return f"<li>{html.escape(text)}" + (f"<ul>{inner}</ul>" if inner else "") + "</li>"


def _evidence(rec: Recommendation) -> go.Figure | None:
    ranked = [a for a in rec.ranking if a.candidate.speedup is not None]
    if not ranked:
        return None
    fig = go.Figure()
    for a in reversed(ranked):
        c = a.candidate
        low, high = c.ci if c.ci else (None, None)
        fig.add_trace(interval_point(label(c.strategy, c.engine) + f" ({c.source})", c.speedup, low, high,
                                     c.strategy, "x" if a.excluded else "circle", a.excluded or ""))
    fig.add_vline(x=1.0, line_dash="dash", line_color="black")
    fig.update_xaxes(title="speedup over ar the evidence gives (x: excluded for the workload)")
    fig.update_layout(title="The evidence, best first")
    return sized(fig, 160 + 28 * len(ranked))


def recommendation(rec: Recommendation) -> View:
    lines = summary_lines(rec)
    evidence = _evidence(rec)
    parts = [f"<h3>{html.escape(lines[0])}</h3>", *(f"<p>{html.escape(line)}</p>" for line in lines[1:]),
             table(ALTERNATIVE_HEADERS, [[(cell, cell) for cell in row] for row in alternatives_rows(rec)]),
             f"<h3>the decision</h3><ul class=\"tree\">{_tree(explain_nodes(rec))}</ul>"]
    note = "" if evidence else ("no measured, modelled or projected figure matched the workload: the answer is the "
                                "prior's")
    return View("recommendation", "Recommendation", (evidence,) if evidence else (), html="".join(parts), note=note)
