"""The Typer app and what every command shares: consoles, one-line errors, progress bars, output."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Annotated, Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specbench import __version__
from specbench.errors import SpecbenchError

app = typer.Typer(help="Benchmark and autotune lossless speculative-decoding strategies.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
out = Console()
err = Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input: one line on stderr and exit code 2, never a traceback."""
    try:
        yield
    except SpecbenchError as exc:
        err.print(f"error: {exc}", style="red", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


def not_implemented(command: str) -> None:
    err.print(f"error: `specbench {command}` is not implemented yet", style="red", highlight=False)
    raise typer.Exit(2)


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[detail]}"), console=err, transient=True)


def table_format(fmt: str) -> str:
    """`table` on a terminal, Markdown when stdout is piped; other formats as asked."""
    return "markdown" if fmt == "table" and not out.is_terminal else fmt


def print_report(runs, fmt: str = "table", wide: bool = False, by: str = "strategy",
                 console: Console | None = None) -> None:
    """The comparison of loaded runs: one table per group of comparable runs, the per-position
    acceptance, a legend of the columns and what the reader must know about the measurements."""
    from specbench.report import acceptance_table, columns_of, comparison, footer, legend, noisy_runs, render

    console = console or out
    frame = comparison(runs, by)
    if frame.empty:
        console.print("no measurements yet")
        return
    rendered = render(frame, fmt, wide, noisy_runs(runs))
    if fmt in ("csv", "json"):
        console.file.write(rendered)
        return
    notes = legend(columns_of(frame, wide)) + footer(runs)
    accept = acceptance_table(frame, fmt) if by == "strategy" else None
    if fmt == "markdown":
        console.file.write(rendered + ("\n" + accept if accept else "") + "\n" + "".join(f"- {n}\n" for n in notes))
        return
    for table in [*rendered, *([accept] if accept else [])]:
        console.print(table)
    for note in notes:
        console.print(note, style="dim", highlight=False, markup=False)


def split_list(values: list[str] | None) -> list[str] | None:
    """Repeatable options that also take comma lists: ["a,b", "c"] -> ["a", "b", "c"]; None when empty."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()] or None


def _version(value: bool) -> None:
    if value:
        out.print(f"specbench {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """specbench: which speculative-decoding strategy is fastest for my model, hardware and workload."""
