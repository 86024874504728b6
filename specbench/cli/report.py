"""`specbench report`: comparison tables and plots of run directories."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specbench.cli.app import app, err, print_report, table_format, user_errors, write_page
from specbench.core.paths import check_output_file


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories and serve run directories; with --html also tune studies' JSON records.", metavar="RUN_DIR")],
    by: Annotated[str, typer.Option(help="strategy (a row per strategy) or category (a row per strategy and category).")] = "strategy",
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv or json.")] = "table",
    wide: Annotated[bool, typer.Option(help="Every column: time shares, memory, cost model, projection, NVML.")] = False,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout.", show_default="stdout")] = None,
    plots: Annotated[bool, typer.Option(help="Also write PNG plots into each run directory.")] = False,
    html: Annotated[Optional[Path], typer.Option(help="Also write one self-contained HTML page of the runs, serve runs and tune studies' JSON records given.", metavar="FILE")] = None,
) -> None:
    """Merge runs into comparison tables (and plots, and an HTML page)."""
    with user_errors():
        if html is not None:
            write_page(run_dirs, html)  # its warnings are the tables' below
            run_dirs = [path for path in run_dirs if not path.is_file()]  # the studies are the page's only
            if not run_dirs:
                return
        if out_file is not None:
            check_output_file(out_file, "--out")

        from specbench.core.files import write_atomic
        from specbench.report.comparison import load_runs
        from specbench.report.plots import write_plots
        from specbench.serving.serve_dir import SERVE_JSON

        serve_dirs = [path for path in run_dirs if (path / SERVE_JSON).is_file()]
        if serve_dirs:
            from specbench.cli.serve import print_result
            from specbench.serving.sweep import read_result

            for path in serve_dirs:
                print_result(read_result(path), fmt == "json")
            run_dirs = [path for path in run_dirs if path not in serve_dirs]
            if not run_dirs:
                return
        runs, warnings = load_runs(run_dirs)
        for warning in warnings:
            err.print(f"warning: {warning}", style="yellow", highlight=False)
        if out_file is None:
            print_report(runs, table_format(fmt), wide, by)
        else:
            text = io.StringIO()
            print_report(runs, fmt, wide, by, Console(file=text, width=120, no_color=True))
            write_atomic(out_file, text.getvalue())
        if plots:
            for run_ in runs:
                for path in write_plots([run_], run_.path):
                    err.print(f"plot: {path}", highlight=False)
