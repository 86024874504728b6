"""`specbench report`: comparison tables and plots of run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specbench.cli.app import app, err, print_report, table_format, user_errors


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    by: Annotated[str, typer.Option(help="strategy or category.")] = "strategy",
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv or json.")] = "table",
    wide: Annotated[bool, typer.Option(help="Every column: time shares, memory, cost model, projection, NVML.")] = False,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout.")] = None,
    plots: Annotated[bool, typer.Option(help="Also write PNG plots into each run directory.")] = False,
) -> None:
    """Merge runs into comparison tables (and plots)."""
    from specbench.plots import write_plots
    from specbench.report import load_runs

    with user_errors():
        runs, warnings = load_runs(run_dirs)
        for warning in warnings:
            err.print(f"warning: {warning}", style="yellow", highlight=False)
        if out_file is None:
            print_report(runs, table_format(fmt), wide, by)
        else:
            with out_file.open("w") as f:
                print_report(runs, fmt, wide, by, Console(file=f, width=120, no_color=True))
        if plots:
            for run_ in runs:
                for path in write_plots([run_], run_.path):
                    err.print(f"plot: {path}", highlight=False)
