"""PNG plots of one or more run directories (matplotlib, Agg backend: no display needed).

Every figure draws the runs' summaries (analysis/stats.py), never a second aggregation: the speedup
per strategy with its 95% interval, tau per category as a heat map, per-position acceptance, where
the time goes (shares summing to 100%), throughput against the memory each strategy needs, and the
NVML bandwidth series when the run recorded one. Each strategy keeps one colour and one marker in
every figure, and every figure stays readable at its native size.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specbench.core.errors import SpecbenchError  # noqa: E402
from specbench.core.files import atomic_path  # noqa: E402
from specbench.core.records import RunResult  # noqa: E402
from specbench.methods.names import BASELINE, all_strategies  # noqa: E402
from specbench.report.comparison import comparison  # noqa: E402

DPI = 130
NVML_METRICS = {
    "dram_bw_util_pct": "DRAM bandwidth utilisation (GPM), %",
    "mem_util_pct": "memory-controller busy time, %",
}
# 16 distinct colours (tab10, then six dark ones of tab20b) and 16 markers: one pair per strategy
COLOURS = [*plt.get_cmap("tab10").colors, "#393b79", "#8c6d31", "#7b4173", "#637939", "#843c39", "#3182bd"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p", "d", "H", "8", "x"]
KNOWN = [BASELINE] + [spec.name for spec in all_strategies()]
SHARES = (("prefill", "#9e9e9e"), ("draft", "#ff7f0e"), ("verify", "#1f77b4"), ("other", "#d62728"))


def style(strategy: str) -> tuple[str, str]:
    """The colour and marker of a strategy, the same in every figure and every run."""
    i = KNOWN.index(strategy) if strategy in KNOWN else len(KNOWN) + zlib.crc32(strategy.encode())
    return COLOURS[i % len(COLOURS)], MARKERS[i % len(MARKERS)]


def write_plots(runs: Sequence[RunResult], out_dir: Path | str) -> list[Path]:
    """Write the plots of runs (measured now or read back) into out_dir; returns the files."""
    if not runs:
        raise SpecbenchError("no runs to plot")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecbenchError(f"cannot create plot directory {out}: {err}") from None
    strategies = comparison(runs, "strategy")
    if strategies.empty:
        return []
    strategies["label"] = _labels(strategies)
    categories = comparison(runs, "category")
    figures = {
        "speedup.png": _speedup(strategies),
        "tau_by_category.png": _tau_by_category(categories),
        "acceptance_by_position.png": _acceptance(strategies),
        "time_breakdown.png": _time_breakdown(strategies),
        "throughput_vs_memory.png": _throughput_memory(strategies),
        "nvml_bandwidth.png": _nvml(runs),
    }
    return save_figures(figures, out)


def save_figures(figures: dict[str, Figure | None], out: Path) -> list[Path]:
    """Each figure as out/NAME, written atomically and closed; None is no figure. Returns the files."""
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        path = out / name
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _labels(frame: pd.DataFrame) -> list[str]:
    """A strategy's name, prefixed with its run's when several runs are shown, and its batch size when
    a run measured several."""
    several = frame["run"].nunique() > 1
    batches = frame["batch_size"] if frame["batch_size"].nunique() > 1 else [None] * len(frame)
    return [(f"{r}/{s}" if several else s) + (f" B={b}" if b is not None else "")
            for r, s, b in zip(frame["run"], frame["strategy"], batches)]


def _speedup(frame: pd.DataFrame) -> Figure | None:
    df = frame.dropna(subset=["speedup"]).reset_index(drop=True)
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.42 * len(df)))
    y = np.arange(len(df))[::-1]
    speed = df["speedup"].to_numpy(dtype=float)
    low = df["speedup_ci_low"].to_numpy(dtype=float)
    high = df["speedup_ci_high"].to_numpy(dtype=float)
    ax.barh(y, speed, color=[style(s)[0] for s in df["strategy"]], height=0.6)
    has_ci = ~(np.isnan(low) | np.isnan(high)) & (df["strategy"] != BASELINE).to_numpy()
    ax.errorbar(speed[has_ci], y[has_ci], xerr=np.clip([speed - low, high - speed], 0, None)[:, has_ci],
                fmt="none", ecolor="black", capsize=3)
    for yi, s, h in zip(y, speed, np.where(has_ci, high, speed)):
        ax.text(h + 0.02 * np.nanmax(high[has_ci] if has_ci.any() else speed), yi, f"{s:.2f}x", va="center", fontsize=9)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(y, df["label"])
    ax.set_xlim(0, 1.18 * np.nanmax(np.where(has_ci, high, speed)))
    ax.set_xlabel("speedup over ar (tokens/s ratio, geometric mean over prompts)")
    ax.set_title("Paired speedup over ar, 95% bootstrap interval")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    return fig


def _tau_by_category(frame: pd.DataFrame) -> Figure | None:
    if frame.empty:
        return None
    drafting = frame[frame["strategy"] != BASELINE]
    df = drafting.assign(label=_labels(drafting))
    if df.empty:
        return None
    table = df.pivot_table(index="label", columns="category", values="tau", sort=False)
    fig, ax = plt.subplots(figsize=(2.2 + 1.05 * table.shape[1], 1.2 + 0.42 * table.shape[0]))
    image = ax.imshow(table.to_numpy(dtype=float), cmap="viridis", aspect="auto")
    ax.set_xticks(range(table.shape[1]), table.columns, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(table.shape[0]), table.index)
    values = table.to_numpy(dtype=float)
    middle = np.nanmean(values)
    for (i, j), value in np.ndenumerate(values):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if value > middle else "white")
    fig.colorbar(image, ax=ax, label="tau (tokens per target forward)")
    ax.set_title("Accepted length per category (bonus token included)")
    fig.tight_layout()
    return fig


def _acceptance(frame: pd.DataFrame) -> Figure | None:
    curves = [(r["label"], r["strategy"], r["acceptance_rate_by_position"]) for _, r in frame.iterrows()
              if len(r["acceptance_rate_by_position"])]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, strategy, rates in curves:
        colour, marker = style(strategy)
        ax.plot(np.arange(1, len(rates) + 1), rates, marker=marker, color=colour, label=label)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("drafts accepting position k / drafts")
    ax.set_title("Per-position acceptance")
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def _time_breakdown(frame: pd.DataFrame) -> Figure | None:
    columns = [f"share_{part}" for part, _ in SHARES]
    df = frame.dropna(subset=columns).reset_index(drop=True)
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.42 * len(df)))
    y = np.arange(len(df))[::-1]
    left = np.zeros(len(df))
    for (part, colour), column in zip(SHARES, columns):
        share = 100 * df[column].to_numpy(dtype=float)
        ax.barh(y, share, 0.6, left=left, color=colour, label=part)
        left += share
    ax.set_yticks(y, df["label"])
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the measured time (%)")
    ax.set_title("Where the time goes")
    ax.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.06), frameon=False)
    fig.tight_layout()
    return fig


def _throughput_memory(frame: pd.DataFrame) -> Figure | None:
    df = frame.dropna(subset=["tokens_per_s", "memory_gb"])
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for _, row in df.iterrows():
        colour, marker = style(row["strategy"])
        ax.scatter(1e3 * row["memory_gb"], row["tokens_per_s"], s=60, color=colour, marker=marker, zorder=3,
                   label=row["label"])
    ax.set_xlabel("memory the strategy needs (MB): weights, KV cache, drafter state")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Throughput against memory")
    ax.grid(alpha=0.3)
    ax.margins(x=0.15, y=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def _nvml(runs: Sequence[RunResult]) -> Figure | None:
    frames = [(run, pd.DataFrame(run.nvml_series)) for run in runs if run.nvml_series]
    series = [(run, frame[frame["metric"].isin(NVML_METRICS)]) for run, frame in frames]
    metrics = [m for m in NVML_METRICS if any((s["metric"] == m).any() for _, s in series)]
    if not metrics:
        return None
    several = len(runs) > 1
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.2 * len(metrics)), squeeze=False, sharex=True)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        for run, frame in series:
            for strategy, group in frame[frame["metric"] == metric].groupby("strategy", sort=False):
                group = group.sort_values("t_s")
                ax.plot(group["t_s"], group["value"], color=style(strategy)[0], linewidth=1.2,
                        label=f"{run.label}/{strategy}" if several else strategy)
        ax.set_ylabel("%")
        ax.set_title(NVML_METRICS[metric], fontsize=10)
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1, 0].set_xlabel("time since the strategy's region started (s)")
    fig.suptitle("GPU memory bandwidth utilisation (NVML)")
    fig.tight_layout()
    return fig
