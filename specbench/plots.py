"""PNG plots of one or more run directories (matplotlib, Agg backend: no display needed).

write_plots() draws what the runs hold: speedup per strategy with its 95% interval, tau per
category, per-position acceptance, the draft/verify/other time split, throughput against peak
memory, and the NVML bandwidth-utilisation series when nvml_series.csv exists. A plot whose data
is absent (an incomplete run, a CPU-only run) is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specbench.errors import SpecbenchError  # noqa: E402
from specbench.measure.stats import acceptance_by_position  # noqa: E402
from specbench.report import Run, comparison, load_runs  # noqa: E402

Labeller = Callable[[str, str], str]
DPI = 130
NVML_METRICS = {
    "dram_bw_util_pct": "DRAM bandwidth utilisation (GPM), %",
    "mem_util_pct": "memory-controller busy time, %",
}


def write_plots(source: Path | str | Sequence[Run], out_dir: Path | str) -> list[Path]:
    """Write the plots for a run directory (or already loaded runs) into out_dir; returns the files."""
    runs = load_runs([source])[0] if isinstance(source, (str, Path)) else list(source)
    if not runs:
        raise SpecbenchError("no runs to plot")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecbenchError(f"cannot create plot directory {out}: {err}") from None
    labeller = _labeller(runs)
    figures = {
        "speedup.png": _speedup(runs, labeller),
        "tau_by_category.png": _tau_by_category(runs, labeller),
        "acceptance_by_position.png": _acceptance(runs, labeller),
        "time_breakdown.png": _time_breakdown(runs, labeller),
        "throughput_vs_memory.png": _throughput_memory(runs, labeller),
        "nvml_bandwidth.png": _nvml(runs, labeller),
    }
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        path = out / name
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _labeller(runs: Sequence[Run]) -> Labeller:
    """Bar/line label of a strategy: its name, prefixed with the run's when several runs are shown."""
    if len(runs) == 1:
        return lambda run_label, strategy: strategy
    return lambda run_label, strategy: f"{run_label}/{strategy}"


def _bar_axes(bars: int, ylabel: str, title: str) -> tuple[Figure, plt.Axes]:
    """Axes wide enough for `bars` bars side by side."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 0.55 * bars), 4.5))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return fig, ax


def _rotate(ax: plt.Axes, labels: Sequence[str]) -> None:
    if len(labels) > 4 or max((len(s) for s in labels), default=0) > 10:
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")


def _speedup(runs: Sequence[Run], label: Labeller) -> Figure | None:
    df = comparison(runs, "strategy").dropna(subset=["speedup"])
    if df.empty:
        return None
    names = [label(r, s) for r, s in zip(df["run"], df["strategy"], strict=True)]
    speed = df["speedup"].to_numpy(dtype=float)
    low = df["speedup_ci_low"].to_numpy(dtype=float)
    high = df["speedup_ci_high"].to_numpy(dtype=float)
    has_ci = ~(np.isnan(low) | np.isnan(high))
    title = "Paired speedup over ar" + (", 95% bootstrap interval" if has_ci.any() else " (no interval recorded)")
    fig, ax = _bar_axes(len(df), "speedup over ar (geometric mean, x)", title)
    x = np.arange(len(df))
    colors = ["#9e9e9e" if s == "ar" else "#1f77b4" for s in df["strategy"]]
    ax.bar(x, speed, color=colors, width=0.6)
    if has_ci.any():
        err = np.vstack([speed - low, high - speed])[:, has_ci]
        ax.errorbar(x[has_ci], speed[has_ci], yerr=np.clip(err, 0, None), fmt="none", ecolor="black", capsize=4)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    top = np.nanmax(np.where(has_ci, high, speed))
    for xi, s, h in zip(x, speed, np.where(has_ci, high, speed), strict=True):
        ax.text(xi, h + 0.02 * top, f"{s:.2f}x", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(x, names)
    ax.set_xlabel("strategy")
    _rotate(ax, names)
    fig.tight_layout()
    return fig


def _tau_by_category(runs: Sequence[Run], label: Labeller) -> Figure | None:
    df = comparison(runs, "category")
    if df.empty:
        return None
    drafting = df[df["strategy"] != "ar"]
    df = drafting if not drafting.empty else df
    df = df.assign(series=[label(r, s) for r, s in zip(df["run"], df["strategy"], strict=True)])
    table = df.pivot_table(index="category", columns="series", values="tau", sort=False)
    categories, series = list(table.index), list(table.columns)
    fig, ax = _bar_axes(len(categories) * (len(series) + 1), "tau (tokens per target step)",
                        "Accepted length per category (bonus token included)")
    width = 0.8 / len(series)
    x = np.arange(len(categories))
    for i, name in enumerate(series):
        ax.bar(x - 0.4 + width * (i + 0.5), table[name].to_numpy(dtype=float), width, label=name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ar (tau = 1)")
    ax.set_xticks(x, categories)
    ax.set_xlabel("prompt category")
    _rotate(ax, categories)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def _position_rates(rows: pd.DataFrame) -> np.ndarray:
    """a_k = P(draft position k accepted | position k - 1 accepted), over a strategy's rows."""
    accepted = [np.asarray(v, dtype=float) for v in rows["accept_by_position"] if v is not None]
    length = max((len(v) for v in accepted), default=0)
    if length == 0:
        return np.array([])
    return np.array(acceptance_by_position(sum(np.pad(v, (0, length - len(v))) for v in accepted),
                                           int(rows["steps"].sum())))


def _acceptance(runs: Sequence[Run], label: Labeller) -> Figure | None:
    curves = []
    for run in runs:
        for strategy in run.strategies():
            rates = _position_rates(run.rows[run.rows["strategy"] == strategy])
            if rates.size and not np.isnan(rates).all():
                curves.append((label(run.label, strategy), rates))
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, rates in curves:
        ax.plot(np.arange(1, rates.size + 1), rates, marker="o", label=name)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(position k accepted | k - 1 accepted)")
    ax.set_title("Per-position acceptance")
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def _time_breakdown(runs: Sequence[Run], label: Labeller) -> Figure | None:
    names, parts = [], []
    for run in runs:
        for strategy in run.strategies():
            rows = run.rows[run.rows["strategy"] == strategy]
            tokens = rows["new_tokens"].sum()
            if tokens > 0:
                names.append(label(run.label, strategy))
                parts.append([1e3 * rows[c].sum() / tokens for c in ("draft_s", "verify_s", "other_s")])
    if not names:
        return None
    data = np.array(parts)
    fig, ax = _bar_axes(len(names), "ms per generated token", "Where the time goes: draft / verify / other")
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    parts = zip(("draft", "verify", "other"), ("#ff7f0e", "#1f77b4", "#bdbdbd"), strict=True)
    for i, (part, color) in enumerate(parts):
        ax.bar(x, data[:, i], 0.6, bottom=bottom, label=part, color=color)
        bottom += data[:, i]
    ax.set_xticks(x, names)
    ax.set_xlabel("strategy")
    _rotate(ax, names)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def _throughput_memory(runs: Sequence[Run], label: Labeller) -> Figure | None:
    df = comparison(runs, "strategy").dropna(subset=["tokens_per_s", "peak_mem_gb"])
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.scatter(df["peak_mem_gb"], df["tokens_per_s"], s=40, color="#1f77b4", zorder=3)
    order = np.argsort(df["tokens_per_s"].to_numpy(dtype=float))
    for rank, i in enumerate(order):  # alternate sides so neighbouring labels do not collide
        row = df.iloc[i]
        ax.annotate(label(row["run"], row["strategy"]), (row["peak_mem_gb"], row["tokens_per_s"]),
                    xytext=(8, 6 if rank % 2 == 0 else -12), textcoords="offset points", fontsize=8)
    ax.set_xlabel("peak memory (GB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Throughput vs peak memory")
    ax.grid(alpha=0.3)
    ax.margins(x=0.25, y=0.15)
    fig.tight_layout()
    return fig


def _nvml(runs: Sequence[Run], label: Labeller) -> Figure | None:
    series = [
        (run, run.nvml_series[run.nvml_series["metric"].isin(NVML_METRICS)])
        for run in runs
        if run.nvml_series is not None
    ]
    metrics = [m for m in NVML_METRICS if any((s["metric"] == m).any() for _, s in series)]
    if not metrics:
        return None
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.2 * len(metrics)), squeeze=False, sharex=True)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        for run, frame in series:
            for strategy, group in frame[frame["metric"] == metric].groupby("strategy", sort=False):
                group = group.sort_values("t_s")
                ax.plot(group["t_s"], group["value"], label=label(run.label, strategy), linewidth=1.2)
        ax.set_ylabel("%")
        ax.set_title(NVML_METRICS[metric], fontsize=10)
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1, 0].set_xlabel("time since the strategy's region started (s)")
    fig.suptitle("GPU memory bandwidth utilisation (NVML)")
    fig.tight_layout()
    return fig
