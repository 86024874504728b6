"""The Typer app and what every command shares: consoles, one-line errors, interrupts, progress bars, output."""

from __future__ import annotations

import os
import shlex
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from typer.core import TyperGroup

from specbench.core.errors import Interrupted, SpecbenchError
from specbench.core.version import __version__
from specbench.training.reporter import Reporter

# specbench downloads nothing (decoding/model_source.py); this keeps every library it loads offline too
os.environ["HF_HUB_OFFLINE"] = "1"

out = Console()
err = Console(stderr=True)


def print_error(message: str) -> None:
    err.print(f"error: {message}", style="red", highlight=False, markup=False, soft_wrap=True)


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except typer.TyperException as exc:  # Click's usage errors: a bad --limit, an unknown option, ...
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `specbench {ctx.info_name} --help`)" if ctx is not None and ctx.parent is not None else ""
        print_error(exc.format_message() + hint)
        raise typer.Exit(2) from None


class OneLineErrors(TyperGroup):
    """Usage errors as one line on stderr with exit code 2, instead of Click's usage box."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        if not args and self.no_args_is_help:  # `specbench` alone prints the help
            return super().make_context(info_name, args, parent, **extra)
        with _one_line_usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage_errors():
            return super().invoke(ctx)


app = typer.Typer(help="Benchmark and autotune lossless speculative-decoding strategies.", cls=OneLineErrors,
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input: one line on stderr and exit code 2, never a traceback."""
    try:
        yield
    except SpecbenchError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None


@contextmanager
def interruptible(how_to_resume: Callable[[Interrupted], str],
                  before: str | None = None) -> Iterator[None]:
    """Ctrl-C and SIGTERM: say what was kept and how to carry on, then exit 130 (143 after SIGTERM).

    `before` replaces the line for an interrupt that comes before any work was kept (while loading).
    SIGTERM would otherwise end the process silently, losing what an interrupt keeps.
    """
    received: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except Interrupted as exc:
        err.print(f"interrupted: {exc.kept}; {how_to_resume(exc)}", highlight=False, soft_wrap=True)
        raise typer.Exit(143 if received else 130) from None
    except KeyboardInterrupt:
        err.print(before or "interrupted before anything was kept", highlight=False, soft_wrap=True)
        raise typer.Exit(143 if received else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def resumable(command: str, resume: Path | None):
    """`interruptible` for a command that `--resume` finishes: an interruption says how (`resume`: the run being
    resumed, if it is one)."""
    def how_to_resume(path: Path) -> str:
        return f"resume it with: specbench {command} --resume {shlex.quote(str(path))}"

    before = (f"interrupted before anything new was measured; {how_to_resume(resume)}" if resume else
              "interrupted before anything was measured")
    return interruptible(lambda stop: how_to_resume(stop.path), before)


def command_line(ctx: typer.Context) -> str:
    """The running command as it could be typed again: `specbench COMMAND` and the options given."""
    words = ["specbench", ctx.info_name]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name).name != "COMMANDLINE":
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False):
            words.append(param.opts[0] if value else param.secondary_opts[0])
            continue
        for item in value if param.multiple else [value]:
            words += [param.opts[0], str(item)]
    return shlex.join(words)


def progress_bar() -> Progress:
    """Done / total, elapsed and remaining time on stderr; nothing at all when stderr is not a terminal."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[detail]}"),
                    console=err, transient=True, disable=not err.is_terminal)


def reporter(bar: Progress) -> Reporter:
    """A training job's Reporter on `bar`: a task per phase, and its kept lines printed above the bar."""
    tasks: dict[str, int] = {}

    def progress(phase: str, done: int, total: int, detail: str) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total, detail="")
        bar.update(tasks[phase], completed=done, detail=detail)

    return Reporter(progress, lambda line: err.print(line, highlight=False))


def table_format(fmt: str) -> str:
    """`table` on a terminal, Markdown when stdout is piped; other formats as asked."""
    return "markdown" if fmt == "table" and not out.is_terminal else fmt


def print_report(runs, fmt: str = "table", wide: bool = False, by: str = "strategy",
                 console: Console | None = None) -> None:
    """The comparison of loaded runs: one table per group of comparable runs, the per-position
    acceptance, a legend of the columns and what the reader must know about the measurements."""
    from specbench.report.comparison import acceptance_table, columns_of, comparison, footer, legend, noisy_runs, render

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


def write_page(paths: list[Path], target: Path, recommendation: Any = None) -> None:
    """`--html`: the page of the results (specbench.report_page) at `target`, and where it is on stderr."""
    import specbench

    specbench.report_page(paths, target, recommendation)
    err.print(f"page: {target}", highlight=False, soft_wrap=True)


def print_table(rendered) -> None:
    """A rich table on the console, or Markdown text as it is (table_format decides which)."""
    if isinstance(rendered, str):
        out.file.write(rendered)
    else:
        out.print(rendered)


def given(**flags: Any) -> dict[str, Any]:
    """The flags the user gave, as a library call's settings: those left out (None, or an empty list or
    mapping) take the config file's value or the default."""
    return {k: v for k, v in flags.items() if v is not None and v != [] and v != {}}


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
