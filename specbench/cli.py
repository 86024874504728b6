"""The `specbench` command line: parse, call a library function, print."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, Optional

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


def _version(value: bool) -> None:
    if value:
        out.print(f"specbench {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """specbench: which speculative-decoding strategy is fastest for my model, hardware and workload."""


@app.command()
def run(
    model: Annotated[Optional[str], typer.Option(help="HF model id or local directory (default: the embedded model).")] = None,
    drafter: Annotated[Optional[list[Path]], typer.Option(help="Drafter directory (repeatable).")] = None,
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help="Strategy: ngram, draft, eagle+dflash, ... (repeatable or comma list; `all` for every implemented one).")] = None,
    suite: Annotated[Optional[str], typer.Option(help="Built-in suite name or a suite file.")] = None,
    categories: Annotated[Optional[list[str]], typer.Option("--categories", "--category", help="Only these categories (repeatable or comma list).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="At most N prompts, spread over the categories.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="New tokens per answer.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 = greedy (lossless check on).")] = None,
    top_p: Annotated[Optional[float], typer.Option()] = None,
    top_k: Annotated[Optional[int], typer.Option()] = None,
    seed: Annotated[Optional[int], typer.Option()] = None,
    dtype: Annotated[Optional[str], typer.Option(help="auto, float32, bfloat16 or float16.")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu or cuda.")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="Unmeasured warm-up passes.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Measured repeats per prompt.")] = None,
    controller: Annotated[Optional[str], typer.Option(help="Override every strategy's controller: fixed, heuristic, entropy, ...")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A strategy knob, e.g. --set draft.k=4 (repeatable).")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile to project the results onto.")] = None,
    profiles: Annotated[Optional[Path], typer.Option(help="TOML file with extra GPU profiles.")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Results directory (default results/).")] = None,
    config: Annotated[Optional[Path], typer.Option(help="TOML config file; flags override it.")] = None,
    resume: Annotated[Optional[Path], typer.Option(help="Resume an interrupted run directory.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Run strategies against plain autoregressive decoding on a prompt suite."""
    from specbench.bench import run_benchmark
    from specbench.config import load_config_file, resolve
    from specbench.measure.lossless import mismatch_detail
    from specbench.report import comparison, load_runs, render
    from specbench.strategies import parse_sets

    def split(values: list[str] | None) -> list[str] | None:
        return [v.strip() for value in values or [] for v in value.split(",") if v.strip()] or None

    with user_errors():
        flags = dict(model=model, drafters=[str(d) for d in drafter or []], strategies=strategy or None,
                     suite=suite, categories=split(categories), limit=limit, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, dtype=dtype, device=device,
                     warmup=warmup, repeats=repeats, controller=controller, gpu=gpu, out=out_dir,
                     profiles=str(profiles) if profiles else None,
                     knobs=parse_sets(set_ or []))
        cfg = resolve(load_config_file(config) if config else {}, flags)
        with progress_bar() as bar:
            task = bar.add_task("prompts", total=None, detail="loading models")

            def advance(prompt_id: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, detail=prompt_id)

            try:
                report = run_benchmark(cfg, advance, resume)
            except KeyboardInterrupt:
                err.print("interrupted: the prompts finished so far are kept; the run is marked incomplete "
                          "(resume it with `specbench run --resume RUN_DIR`)", highlight=False)
                raise typer.Exit(130) from None
        if as_json:
            sys.stdout.write(json.dumps(report.as_json(), indent=2, default=float) + "\n")
            return
        runs, _ = load_runs([report.run_dir])
        print_table(render(comparison(runs), "table" if out.is_terminal else "markdown"))
        if cfg.temperature == 0:
            for r in report.results:
                if r["mismatches"]:
                    err.print(f"LOSSLESS CHECK FAILED: {r['strategy']}: {r['mismatches']} of {r['prompts']} greedy "
                              "outputs differ from ar" + mismatch_detail(r["first_divergence"], r["divergence_margin"]),
                              style="bold red", highlight=False)
        err.print(f"results: {report.run_dir}", highlight=False)


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


@app.command()
def suites(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in suites with their categories and counts."""
    from specbench.suites import builtin_suite_names, load_suite

    with user_errors():
        listing = {name: load_suite(name).categories() for name in builtin_suite_names()}
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    for name, categories in listing.items():
        out.print(f"{name}: {sum(categories.values())} prompts", highlight=False)
        for category, count in categories.items():
            out.print(f"  {category:<16} {count}", highlight=False)


@app.command()
def hardware(
    profiles: Annotated[Optional[Path], typer.Option(help="TOML file with extra GPU profiles.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List the GPU profiles and the local device."""
    from specbench.hardware import detect_local_gpu, hardware_listing, hardware_table, load_profiles

    with user_errors():
        known = load_profiles(profiles)
        local = detect_local_gpu()
    if as_json:
        sys.stdout.write(json.dumps(hardware_listing(known, local), indent=2, default=str) + "\n")
    else:
        out.print(hardware_table(known, local))


@app.command()
def train(
    strategy: Annotated[str, typer.Option(help="eagle, mtp, dflash or dspark.")],
    prompts: Annotated[str, typer.Option(help="Suite name or file with the training prompts.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Drafter directory to write.")],
    model: Annotated[Optional[str], typer.Option(help="Target: HF id or local directory (default: embedded).")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 300,
    batch_size: Annotated[int, typer.Option()] = 8,
    lr: Annotated[float, typer.Option()] = 1e-3,
    max_new_tokens: Annotated[int, typer.Option(help="Length of the regenerated answers.")] = 128,
    limit: Annotated[Optional[int], typer.Option(help="Use at most N prompts.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A drafter knob, e.g. --set dflash.block_size=8.")] = None,
    device: Annotated[str, typer.Option()] = "auto",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Train a drafter against a target by self-distillation (resumes an interrupted training)."""
    from specbench.strategies import parse_sets
    from specbench.training.run import train_drafter

    with user_errors(), progress_bar() as bar:
        knobs = parse_sets(set_ or [])
        extra = set(knobs) - {strategy}
        if extra:
            raise SpecbenchError(f"--set for {', '.join(sorted(extra))} does not apply to training {strategy}")
        tasks: dict[str, int] = {}

        def advance(phase: str, done: int, total: int, loss: float | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total, detail="")
            bar.update(tasks[phase], completed=done, detail=f"loss {loss:.3f}" if loss is not None else "")

        result = train_drafter(strategy, prompts, out_dir, model, steps, batch_size, lr, max_new_tokens, limit,
                               knobs.get(strategy), device, seed, advance)
    out.print(f"{result.strategy} drafter: {result.out_dir} ({result.prompts} prompts, {result.steps} steps, "
              f"loss {result.first_loss:.3f} -> {result.final_loss:.3f})", highlight=False)


@app.command()
def tune() -> None:
    """Search strategy knobs with Optuna (not implemented yet)."""
    not_implemented("tune")


@app.command()
def recommend() -> None:
    """Pick a strategy for a workload and a GPU (not implemented yet)."""
    not_implemented("recommend")
