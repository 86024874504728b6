"""The Typer app and what every command shares: consoles, one-line errors, progress bars, output."""

from __future__ import annotations

import sys
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


def print_table(table_or_text) -> None:
    """A rich table on a terminal, plain Markdown text when piped."""
    if isinstance(table_or_text, str):
        sys.stdout.write(table_or_text)
    else:
        out.print(table_or_text)


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[detail]}"), console=err, transient=True)


def split_list(values: list[str] | None) -> list[str] | None:
    """Repeatable options that also take comma lists: ["a,b", "c"] -> ["a", "b", "c"]; None when empty."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()] or None


def size_list(text: str | None, option: str) -> tuple[int, ...] | None:
    """A comma list of sizes, "1,4,16" -> (1, 4, 16); None when the option was not given. The values
    are checked (order, range) where they are used."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SpecbenchError(f"{option} {text}: expected a comma list of integers such as 1,4,16") from None


def _version(value: bool) -> None:
    if value:
        out.print(f"specbench {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """specbench: which speculative-decoding strategy is fastest for my model, hardware and workload."""
