"""Tables of the load axis, for the terminal (rich), pipes (Markdown) and --json: the forward-cost
table, speedup by batch size (measured beside modelled), and the best draft length per batch size."""

from __future__ import annotations

import pandas as pd
from rich.table import Table

from specbench.analysis.cost_table import CostTable, absorbed
from specbench.core.records import LoadAxis, StrategySummary
from specbench.methods.names import BASELINE


def cost_frames(table: CostTable) -> dict[str, pd.DataFrame]:
    """Milliseconds per target forward (batch x context x mask by verify length), per drafter proposal
    (by budget) and of the batched engine's step overhead (batch by block length)."""
    frames = {}
    if table.target:
        target = pd.DataFrame(table.target)
        target["ms"] = 1e3 * target.median_s
        wide = target.pivot_table(index=["mask", "batch", "context"], columns="tokens", values="ms")
        wide.columns = [f"n={n}" for n in wide.columns]
        frames["target forward, ms (n = verify length)"] = wide.reset_index()  # chain before tree
    if table.drafters:
        drafts = pd.DataFrame([{"drafter": key.split(":")[0], "budget": r["budget"], "ms": 1e3 * r["median_s"]}
                               for key, rows in table.drafters.items() for r in rows if absorbed(r) == 1])
        wide = drafts.pivot_table(index="drafter", columns="budget", values="ms", sort=False)
        wide.columns = [f"k={k}" for k in wide.columns]
        frames["one proposal per sequence, ms (k = draft budget)"] = wide.reset_index()
    if table.overhead:
        overhead = pd.DataFrame(table.overhead)
        overhead["ms"] = 1e3 * overhead.median_s
        wide = overhead.pivot_table(index="batch", columns="tokens", values="ms")
        wide.columns = [f"n={n}" for n in wide.columns]
        frames["batched step overhead, ms (n = verify length)"] = wide.reset_index()
    return frames


def _text(value) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def render_frame(df: pd.DataFrame, title: str, markdown: bool) -> str | Table:
    """A rich table, or a Markdown table under a heading line when the output is piped."""
    cells = [[_text(v) for v in row] for row in df.itertuples(index=False)]
    if markdown:
        text = pd.DataFrame(cells, columns=[str(c) for c in df.columns]).to_markdown(index=False, disable_numparse=True)
        return f"{title}\n\n{text}\n\n"
    table = Table(title=title)
    for i, column in enumerate(df.columns):
        table.add_column(str(column), justify="left" if df[column].dtype == object else "right", no_wrap=i == 0)
    for row in cells:
        table.add_row(*row)
    return table


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def batch_frames(summary: list[StrategySummary], load: LoadAxis | None) -> dict[str, pd.DataFrame]:
    """Speedup over batched ar per strategy and batch size (measured, modelled in brackets), tokens/s of the
    whole batch where measured, where each strategy stops paying, and the best draft tokens per batch size."""
    measured = {(r.strategy, r.batch_size): r for r in summary}
    # a run without a load axis (no rows, or older than it) models nothing
    modelled = {(p.strategy, p.batch_size): p.modelled_speedup for p in load.points} if load else {}
    strategies = list(dict.fromkeys(r.strategy for r in summary if r.strategy != BASELINE))
    sizes = sorted({b for _, b in measured} | {b for _, b in modelled})
    if len(sizes) < 2:  # no load axis: one batch size measured, none other in the cost table
        return {}
    frames = {"speedup over batched ar by batch size: measured (modelled from the cost table)": pd.DataFrame(
        [{"strategy": s, **{f"B={b}": _cell(measured.get((s, b)), modelled.get((s, b))) for b in sizes}}
         for s in strategies])}
    measured_sizes = sorted({b for _, b in measured})
    if len(measured_sizes) > 1:
        frames["tokens/s of the whole batch (measured)"] = pd.DataFrame(
            [{"strategy": s, **{f"B={b}": measured[(s, b)].tokens_per_s if (s, b) in measured else None
                                for b in measured_sizes}} for s in [BASELINE, *strategies]])
    stops = load.stops_paying if load else {}
    if stops:
        frames["where speculation stops paying (first batch size below 1x)"] = pd.DataFrame(
            [{"strategy": s, "measured": stop_text(v["measured"], v["measured_up_to"]),
              "modelled": stop_text(v["modelled"], v["modelled_up_to"])} for s, v in stops.items()])
    schedule = load.schedule if load else {}
    if schedule:
        frames["best draft tokens per step by batch size (modelled; 0 = plain decoding)"] = pd.DataFrame(
            [{"strategy": s, **{f"B={p['batch_size']}": f"{p['draft_tokens']} ({p['speedup']:.2f}x)" for p in best}}
             for s, best in schedule.items()])
    return frames


def _cell(measured: StrategySummary | None, modelled: float | None) -> str:
    parts = [_x(measured.speedup)] if measured else []
    if modelled is not None:
        parts.append(f"({modelled:.2f})")
    return " ".join(parts) or "-"


def stop_text(batch: int | None, up_to: int) -> str:
    """Where speculation stops paying: the first batch size below 1x, or how far it was seen to pay."""
    return f"B={batch}" if batch is not None else f"pays up to B={up_to}"
