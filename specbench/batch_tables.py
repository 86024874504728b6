"""Tables of the load axis, for the terminal (rich), pipes (Markdown) and --json: the forward-cost
table, speedup by batch size (measured beside modelled), and the best draft length per batch size."""

from __future__ import annotations

import pandas as pd
from rich.table import Table

from specbench.measure.costs import CostTable


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
                               for key, rows in table.drafters.items() for r in rows])
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
        lines = [f"{title}", "", "| " + " | ".join(map(str, df.columns)) + " |",
                 "|" + "|".join("---" for _ in df.columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells]) + "\n\n"
    table = Table(title=title)
    for i, column in enumerate(df.columns):
        table.add_column(str(column), justify="left" if df[column].dtype == object else "right", no_wrap=i == 0)
    for row in cells:
        table.add_row(*row)
    return table
