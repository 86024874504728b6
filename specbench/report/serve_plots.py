"""The two figures of a serve run a person looks at first (matplotlib, Agg).

- TPOT p50 against concurrency, one line per strategy and `ar`'s dashed: where a strategy's line crosses
  ar's it stops paying.
- Pareto of tokens/s per user (1000 / TPOT p50) against total output tokens/s, one line per strategy
  through its concurrency levels (labelled): up and to the right is better, a strategy whose line lies
  inside another's is dominated at every load.
"""

from __future__ import annotations

from pathlib import Path

from specbench.core.records.serve_records import ServeLevel, ServeResult
from specbench.methods.names import BASELINE
from specbench.report.plots import plt, save_figures, style  # plots chose the Agg backend


def _closed_loop(result: ServeResult) -> dict[str, list[ServeLevel]]:
    lines: dict[str, list[ServeLevel]] = {}
    for e in result.levels:
        if e.concurrency is not None and e.tpot_ms.p50 is not None:
            lines.setdefault(e.strategy, []).append(e)
    return {name: sorted(points, key=lambda e: e.concurrency) for name, points in lines.items()}


def _line(name: str) -> dict[str, str]:
    """A strategy's line: its own colour and marker; `ar`'s black and dashed, the reference."""
    colour, marker = style(name)
    if name == BASELINE:
        return {"color": "black", "marker": marker, "linestyle": "--", "label": name}
    return {"color": colour, "marker": marker, "linestyle": "-", "label": name}


def _labelled(fig, ax, xlabel: str, ylabel: str, title: str):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _tpot(lines: dict[str, list[ServeLevel]]):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, points in lines.items():
        ax.plot([e.concurrency for e in points], [e.tpot_ms.p50 for e in points], **_line(name))
    ax.set_xscale("log", base=2)
    levels = sorted({e.concurrency for points in lines.values() for e in points})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    return _labelled(fig, ax, "concurrency (clients, closed loop)", "TPOT p50, ms (lower is better)",
                     "Time per output token against load")


def _pareto(lines: dict[str, list[ServeLevel]]):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, points in lines.items():
        line = _line(name)
        xs = [e.output_tok_s for e in points]
        ys = [e.tok_s_per_user for e in points]
        ax.plot(xs, ys, **line)
        for e, x, y in zip(points, xs, ys):
            ax.annotate(str(e.concurrency), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=line["color"])
    return _labelled(fig, ax, "total output tokens/s", "tokens/s per user (1000 / TPOT p50)",
                     "Per-user speed against throughput (labels: concurrency)")


def write_serve_plots(result: ServeResult, out_dir: Path) -> list[Path]:
    """The figures of a serve result into out_dir; none without closed-loop levels."""
    lines = _closed_loop(result)
    if not lines:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    return save_figures({"tpot_vs_concurrency.png": _tpot(lines), "pareto.png": _pareto(lines)}, out_dir)
