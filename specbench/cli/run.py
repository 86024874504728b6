"""`specbench run`: every strategy against plain decoding on a prompt suite."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from specbench.cli import options
from specbench.cli.app import (
    app,
    err,
    given,
    print_report,
    print_table,
    progress_bar,
    resumable,
    size_list,
    split_list,
    table_format,
    user_errors,
    write_page,
)
from specbench.cli.options import default
from specbench.core.errors import SpecbenchError
from specbench.core.ranges import check_range, check_sizes
from specbench.engines.engine_registry import parse_engine_args
from specbench.methods.controllers import CONTROLLERS
from specbench.methods.knobs import parse_sets
from specbench.methods.names import COMBINATIONS, DEFAULT_STRATEGIES

if TYPE_CHECKING:
    from specbench.core.records import RunResult
    from specbench.report.run_report import Line


@app.command()
def run(
    model: options.Model = None,
    drafter: options.Drafters = None,
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help=f"Strategy: ngram, draft, eagle+dflash, ... (repeatable or comma list); `default` is {', '.join(DEFAULT_STRATEGIES)}; `all` every drafter and {len(COMBINATIONS)} combinations.", show_default=default("strategies"))] = None,
    suite: options.Suite = None,
    dataset: options.Dataset = None,
    multi_turn: options.MultiTurn = None,
    categories: options.Categories = None,
    limit: options.Limit = None,
    max_new_tokens: options.MaxNewTokens = None,
    temperature: options.Temperature = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling: keep the smallest token set with this much probability (1 = off).", show_default=default("top_p"))] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Sample among the k most likely tokens only (0 = off).", show_default=default("top_k"))] = None,
    seed: options.Seed = None,
    dtype: options.Dtype = None,
    device: options.Device = None,
    warmup: Annotated[Optional[int], typer.Option(help="Unmeasured warm-up passes at least, each over the shortest and the longest prompt measured.", show_default=default("warmup"))] = None,
    warmup_cap: Annotated[Optional[int], typer.Option(help="An engine that compiles (vLLM): warm-up passes at most, repeated until the last two are within 10%.", show_default=default("warmup_cap"))] = None,
    outlier_k: Annotated[Optional[float], typer.Option(help="A prompt above median + k*MAD of its strategy's seconds per token is measured again (both timings reported).", show_default=default("outlier_k"))] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Measured repeats per prompt.", show_default=default("repeats"))] = None,
    controller: Annotated[Optional[str], typer.Option(help=f"Override every strategy's controller: {', '.join(CONTROLLERS)}.", show_default=default("controller", "each strategy's own"))] = None,
    set_: options.Knobs = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile to project the results onto (see `specbench hardware`).", show_default=default("gpu", "none"))] = None,
    profiles: options.Profiles = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Decode the prompts B at a time, in lockstep (ar and the chain strategies: ngram, draft, dflash, dspark); the speedup is over batched ar at the same B.", show_default="1")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option(help="Several batch sizes, increasing, each in turn (e.g. 1,4,16): a column per batch size, with the modelled speedup beside the measured.", show_default="1")] = None,
    engine: options.Engine = None,
    engine_args: options.EngineArgs = None,
    out_dir: options.ResultsDir = None,
    config: options.ConfigFile = None,
    resume: Annotated[Optional[Path], typer.Option(help="Finish an interrupted run directory with its saved configuration.", show_default="none")] = None,
    cost_model: Annotated[Optional[bool], typer.Option("--cost-model/--no-cost-model", help="Time the forwards the cost model predicts from (first run only; stored in results/costs/).", show_default=default("cost_model"))] = None,
    wide: options.Wide = False,
    as_json: options.Json = False,
    html: options.Html = False,
) -> None:
    """Run strategies against plain autoregressive decoding on a prompt suite."""
    with user_errors():
        flags = given(
            model=model, drafters=[str(d) for d in drafter or []], strategies=strategy or None, suite=suite,
            dataset=dataset, multi_turn=multi_turn,
            categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens, temperature=temperature,
            top_p=top_p, top_k=top_k, seed=seed, dtype=dtype, device=device, warmup=warmup, repeats=repeats,
            warmup_cap=warmup_cap, outlier_k=outlier_k,
            controller=controller, gpu=gpu, out=out_dir, profiles=str(profiles) if profiles else None,
            cost_model=cost_model, engine=engine, engine_args=parse_engine_args(engine_args),
            knobs=parse_sets(set_ or []), batch_sizes=batch_size_list(batch_size, batch_sizes))
        show(measure(config, resume, flags), wide, as_json, html)


def show(result: RunResult, wide: bool, as_json: bool, html: bool) -> None:
    """The run's notes, its page (--html), then its JSON or its tables and checks."""
    from specbench.report.run_dir import saved_config
    from specbench.report.run_report import lossless_checks, start_and_notes, stops_paying

    print_lines(start_and_notes(result))
    if html:
        write_page([result.path], result.path / "report.html")
    if as_json:
        from specbench.core.strict_json import dumps

        sys.stdout.write(dumps(result.as_json(), indent=2) + "\n")
        return
    print_tables(result, wide)
    measured = saved_config(result)
    print_lines(stops_paying(result, measured) + lossless_checks(result, measured))
    err.print(f"results: {result.path}", highlight=False)


def batch_size_list(batch_size: int | None, batch_sizes: str | None) -> list[int] | None:
    """--batch-size B or --batch-sizes 1,4,16 as the run configuration's `batch_sizes`."""
    if batch_size is not None and batch_sizes is not None:
        raise SpecbenchError("give --batch-size or --batch-sizes, not both")
    check_range("--batch-size", batch_size)
    sizes = (batch_size,) if batch_size is not None else size_list(batch_sizes, "--batch-sizes")
    if sizes is not None:
        check_sizes(sizes, "--batch-sizes")
    return list(sizes) if sizes else None


def measure(config: Path | None, resume: Path | None, flags: dict[str, Any]) -> RunResult:
    """The run (specbench.run), with a progress bar, the start-up and the estimate from the warm-up on stderr;
    an interruption says how to resume. Every check that needs no torch comes first: a bad input is refused in
    well under a second."""
    import specbench
    from specbench.report.run_report import estimate_lines

    with resumable("run", resume), progress_bar() as bar:
        task = bar.add_task("prompts", total=None, detail="loading models")

        def advance(prompt_id: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, detail=prompt_id)

        def estimate(figures: dict) -> None:
            bar.update(task, total=figures["prompts"],
                       detail="timing forwards for the cost model" if figures["cost_model"] else "")
            print_lines(estimate_lines(figures))

        return specbench.run(config, resume, advance, estimate, **flags)


def print_tables(result: RunResult, wide: bool) -> None:
    """The comparison table, then one table per batch-size axis."""
    from specbench.report.batch_tables import batch_frames, render_frame

    print_report([result], table_format("table"), wide)
    for title, frame in batch_frames(result.summary, result.load).items():
        print_table(render_frame(frame, title, markdown=table_format("table") == "markdown"))


def print_lines(lines: list[Line]) -> None:
    for line in lines:
        err.print(line.text, style=line.style, highlight=False, soft_wrap=True)
