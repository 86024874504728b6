"""PNG plots of the load axis (matplotlib, Agg backend): speedup against batch size per strategy
(measured points, the modelled line, the 1x line where speculation stops paying), and the cost of a
verify forward against its length at each batch size."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import pandas as pd  # noqa: E402

from specbench.analysis.cost_table import CHAIN, CostTable  # noqa: E402
from specbench.core.files import atomic_path  # noqa: E402
from specbench.core.records import LoadPoint, RunResult, StrategySummary  # noqa: E402
from specbench.methods.names import BASELINE  # noqa: E402

DPI = 130


def speedup_by_batch(points: list[LoadPoint], summary: list[StrategySummary], path: Path) -> Path | None:
    """Speedup over batched `ar` against batch size: modelled lines, measured points, the 1x line."""
    modelled = pd.DataFrame([p.as_dict() for p in points])
    measured = pd.DataFrame([{"strategy": r.strategy, "batch_size": r.batch_size, "speedup": r.speedup}
                             for r in summary if r.strategy != BASELINE and r.speedup is not None])
    if modelled.empty and measured.empty:
        return None
    strategies = list(dict.fromkeys([*modelled.get("strategy", []), *measured.get("strategy", [])]))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, strategy in enumerate(strategies):
        colour = colours[i % len(colours)]
        if not modelled.empty:
            line = modelled[modelled.strategy == strategy]
            ax.plot(line.batch_size, line.modelled_speedup, "-", color=colour, label=f"{strategy} (modelled)")
        if not measured.empty:
            dots = measured[measured.strategy == strategy]
            ax.plot(dots.batch_size, dots.speedup, "o", color=colour, markersize=7, label=f"{strategy} (measured)")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.text(ax.get_xlim()[0], 1.0, " 1x: below it speculation costs time", va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    sizes = sorted(set(modelled.get("batch_size", [])) | set(measured.get("batch_size", [])))
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over batched ar")
    ax.set_title("Speedup against batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def verify_costs(table: CostTable, path: Path) -> Path | None:
    """Chain verify forward time against verify length, one line per batch size, one panel per context."""
    rows = pd.DataFrame(table.target)
    if rows.empty:
        return None
    rows = rows[rows["mask"] == CHAIN]
    contexts = sorted(rows.context.unique())
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4.2), squeeze=False, sharey=True)
    for ax, context in zip(axes[0], contexts):
        for batch, line in rows[rows.context == context].groupby("batch"):
            line = line.sort_values("tokens")
            ax.plot(line.tokens, 1e3 * line.median_s, "o-", label=f"batch {batch}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted(rows.tokens.unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("verify length (tokens per sequence)")
        ax.set_title(f"context {context}")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("target forward, ms")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"Verify cost ({table.key['device']}, {table.key['dtype']})")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def write_batch_plots(result: RunResult, table: CostTable | None) -> list[Path]:
    """The load-axis plots a run has data for, into its directory: speedup by batch size where it was
    modelled or measured at more than one batch size, verify costs where there is a cost table."""
    written = []
    points = result.load.points if result.load else []
    if points or len({r.batch_size for r in result.summary}) > 1:
        written.append(speedup_by_batch(points, result.summary, result.path / "speedup_by_batch.png"))
    if table is not None:
        written.append(verify_costs(table, result.path / "verify_cost.png"))
    return [p for p in written if p is not None]
