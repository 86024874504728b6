"""`specbench report`: comparison tables and plots of run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specbench.cli.app import app, err, out, print_table, user_errors


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    by: Annotated[str, typer.Option(help="strategy or category.")] = "strategy",
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv or json.")] = "table",
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout.")] = None,
    plots: Annotated[bool, typer.Option(help="Also write PNG plots into each run directory.")] = False,
) -> None:
    """Merge runs into comparison tables (and plots)."""
    from specbench.plots import write_plots
    from specbench.report import comparison, load_runs, render

    with user_errors():
        runs, warnings = load_runs(run_dirs)
        for warning in warnings:
            err.print(f"warning: {warning}", style="yellow", highlight=False)
        frame = comparison(runs, by=by)
        if out_file is None:
            print_table(render(frame, "markdown" if fmt == "table" and not out.is_terminal else fmt))
        elif fmt == "table":
            with out_file.open("w") as f:
                Console(file=f, width=200).print(render(frame, fmt))
        else:
            out_file.write_text(render(frame, fmt))
        if plots:
            for run_ in runs:
                for path in write_plots([run_], run_.path):
                    err.print(f"plot: {path}", highlight=False)
