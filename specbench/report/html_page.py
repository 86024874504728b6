"""One self-contained HTML page of runs, serve sweeps and tune studies: the data, the scripts and the styles inline,
so the file opens from disk with no network and no server (GuideLLM's report, which loads its scripts from a
hosted site, went blank when they moved: vllm-project/guidellm#303).

The figures are Plotly's (plotly.py builds them, plotly.js draws them: interactive, zoomable, with hover values,
and one library for every view). The page carries plotly.js's cartesian bundle (every trace the views draw:
scatter, bar, heatmap; 1.5 MB against the full bundle's 4.8 MB, which a browser takes twice as long to load),
shipped in specbench/assets/plotly by scripts/vendor_plotly.py for the plotly.js version plotly.py pins; with
another plotly.py installed, its own full bundle. It is inlined once, gzip-compressed and base64-encoded, and the
page's loader decompresses it with the browser's DecompressionStream before drawing each figure from its JSON.
When every figure is drawn the loader sets `data-drawn="yes"` on the body (`failed` and the error on the page
where it could not).
"""

from __future__ import annotations

import base64
import gzip
import html
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from specbench.core.files import write_atomic
from specbench.core.records import RunResult
from specbench.core.records.serve_records import ServeResult
from specbench.core.version import __version__
from specbench.report.html_recommendation import recommendation
from specbench.report.html_sweeps import StudyView, serve_sweep, tune_study
from specbench.report.html_views import RUN_VIEWS, View

if TYPE_CHECKING:
    from specbench.recommender.recommendation import Recommendation

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 0 16px 48px; color: #222; }
nav a { margin-right: 12px; } h2 { border-bottom: 1px solid #ddd; padding-top: 12px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { padding: 3px 8px; border-bottom: 1px solid #eee; }
table.sortable th { cursor: pointer; background: #f4f4f4; } table.sortable td { text-align: right; }
table.sortable td:first-child { text-align: left; } table.facts th { text-align: left; vertical-align: top; }
table.facts td { font-family: monospace; word-break: break-all; } .note { color: #555; } .empty { color: #a40; }
.warning { color: #b00; } .left-out { background: #fff4e0; padding: 6px 10px; }
"""

# sorting the tables by a column (each cell carries its value in data-value), and drawing the figures once
# plotly.js is decompressed
SCRIPT = """
for (const th of document.querySelectorAll("table.sortable th")) {
  th.addEventListener("click", () => {
    const body = th.closest("table").tBodies[0], i = th.cellIndex, up = th.dataset.order !== "up";
    th.dataset.order = up ? "up" : "down";
    const key = row => { const v = row.cells[i].dataset.value, n = parseFloat(v); return isNaN(n) ? v : n; };
    const rows = [...body.rows].sort((a, b) => {
      const x = key(a), y = key(b);
      return (typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : typeof x === "number" ? -1 : 1) * (up ? 1 : -1);
    });
    body.append(...rows);
  });
}
(async () => {
  const packed = document.getElementById("plotly-gzip").textContent.trim();
  const bytes = Uint8Array.from(atob(packed), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const code = document.createElement("script");
  code.textContent = await new Response(stream).text();
  document.head.appendChild(code);
  for (const data of document.querySelectorAll("script.figure-data")) {
    const figure = JSON.parse(data.textContent);
    await Plotly.newPlot(data.dataset.target, figure.data, figure.layout, {displaylogo: false, responsive: true});
  }
  document.body.dataset.drawn = "yes";
})().catch(error => {
  document.body.dataset.drawn = "failed";
  document.getElementById("script-error").textContent = "the figures could not be drawn: " + error;
});
"""


@dataclass
class Page:
    """What a page shows: runs, serve runs, studies and a recommendation, and what a reader must know about them."""

    runs: list[RunResult] = field(default_factory=list)
    serves: list[ServeResult] = field(default_factory=list)
    studies: list[StudyView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a reader must know: what was left out and why
    recommendation: Recommendation | None = None

    def views(self) -> list[View]:
        """Every view, in the page's order: the recommendation's, the runs' (where there are runs), the serve
        sweep's, the studies'."""
        run_views = [view(self.runs) for view in RUN_VIEWS] if self.runs else []
        return [*([recommendation(self.recommendation)] if self.recommendation else []), *run_views,
                *([serve_sweep(self.serves)] if self.serves else []),
                *([tune_study(self.studies)] if self.studies else [])]


CARTESIAN = Path(__file__).resolve().parents[1] / "assets" / "plotly" / "plotly-cartesian.min.js"


def plotly_js() -> str:
    """The cartesian bundle shipped with specbench where it is the plotly.js version plotly.py's figures are
    made for, else plotly.py's own full bundle."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if CARTESIAN.is_file():
        code = CARTESIAN.read_text(encoding="utf-8")
        if f"(cartesian - minified) v{get_plotlyjs_version()}\n" in code[:200]:
            return code
    return get_plotlyjs()


@cache
def packed_plotly() -> str:
    """plotly.js, gzip-compressed (fixed mtime: the same page for the same data) and base64-encoded."""
    return base64.b64encode(gzip.compress(plotly_js().encode(), mtime=0)).decode()


def _figure_json(figure) -> str:
    return figure.to_json().replace("</", "<\\/")  # a JSON escape that keeps the script element open


def _section(view: View) -> str:
    parts = [f'<section id="{view.key}"><h2>{html.escape(view.title)}</h2>']
    if view.empty:
        parts.append(f'<p class="empty">Not shown: {html.escape(view.note)}</p></section>')
        return "".join(parts)
    for i, figure in enumerate(view.figures):
        target = f"{view.key}-figure-{i}"
        parts.append(f'<div class="figure" id="{target}"></div><script type="application/json" class="figure-data" '
                     f'data-target="{target}">{_figure_json(figure)}</script>')
    parts.append(view.html)
    if view.note:
        parts.append(f'<p class="note">{html.escape(view.note)}</p>')
    return "".join(parts) + "</section>"


def _title(page: Page) -> str:
    names = ([f"recommend {page.recommendation.strategy}"] if page.recommendation else []) + [
        r.label for r in page.runs] + [s.path.name for s in page.serves] + [s.record.study for s in page.studies]
    return "specbench report: " + (", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else ""))


def render_page(page: Page) -> str:
    """The page as one HTML document."""
    views = page.views()
    title = html.escape(_title(page))
    nav = " ".join(f'<a href="#{v.key}">{html.escape(v.title)}</a>' for v in views)
    notes = "".join(f'<p class="left-out">{html.escape(note)}</p>' for note in page.notes)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<meta name="generator" content="specbench {__version__}"><style>{STYLE}</style></head>'
            f'<body data-drawn="no"><h1>{title}</h1><nav>{nav}</nav><p id="script-error" class="warning"></p>'
            f'{notes}{"".join(_section(v) for v in views)}'
            f'<script type="text/plain" id="plotly-gzip">{packed_plotly()}</script>'
            f'<script>{SCRIPT}</script></body></html>\n')


def write_page(page: Page, path: str | Path) -> Path:
    """Write the page to `path`, atomically: a half-written page is never left behind."""
    path = Path(path)
    write_atomic(path, render_page(page))
    return path

