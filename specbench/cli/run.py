"""`specbench run`: every strategy against plain decoding on a prompt suite."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.backends.registry import parse_engine_args
from specbench.cli import options
from specbench.cli.app import (
    app,
    err,
    interruptible,
    print_report,
    print_table,
    progress_bar,
    size_list,
    split_list,
    table_format,
    user_errors,
)
from specbench.cli.options import default
from specbench.config import load_config_file, resolve
from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError
from specbench.core.ranges import check_range, check_sizes
from specbench.output.run_dir import RunDir
from specbench.strategies.controllers import CONTROLLERS
from specbench.strategies.knobs import parse_sets
from specbench.strategies.names import BASELINE, COMBINATIONS, DEFAULT_STRATEGIES


def compiling(seconds: float | None) -> str:
    """What part of an engine's start-up was compiling (vLLM reports it)."""
    if seconds is None:
        return "compiled; vLLM times its compilation on a GPU only"
    return f"compiling {seconds:.0f} s" if seconds else "eager: nothing compiled"


@app.command()
def run(
    model: options.Model = None,
    drafter: options.Drafters = None,
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help=f"Strategy: ngram, draft, eagle+dflash, ... (repeatable or comma list); `default` is {', '.join(DEFAULT_STRATEGIES)}; `all` every drafter and {len(COMBINATIONS)} combinations.", show_default=default("strategies"))] = None,
    suite: options.Suite = None,
    categories: options.Categories = None,
    limit: options.Limit = None,
    max_new_tokens: options.MaxNewTokens = None,
    temperature: options.Temperature = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling: keep the smallest token set with this much probability (1 = off).", show_default=default("top_p"))] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Sample among the k most likely tokens only (0 = off).", show_default=default("top_k"))] = None,
    seed: options.Seed = None,
    dtype: options.Dtype = None,
    device: options.Device = None,
    warmup: Annotated[Optional[int], typer.Option(help="Unmeasured warm-up passes over the first prompt.", show_default=default("warmup"))] = None,
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
) -> None:
    """Run strategies against plain autoregressive decoding on a prompt suite."""
    with user_errors():
        # every check that needs no torch comes first: a bad input is refused in well under a second
        if batch_size is not None and batch_sizes is not None:
            raise SpecbenchError("give --batch-size or --batch-sizes, not both")
        check_range("--batch-size", batch_size)
        sizes = (batch_size,) if batch_size is not None else size_list(batch_sizes, "--batch-sizes")
        if sizes is not None:
            check_sizes(sizes, "--batch-sizes")
        flags = dict(model=model, drafters=[str(d) for d in drafter or []], strategies=strategy or None,
                     suite=suite, categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, dtype=dtype, device=device,
                     warmup=warmup, repeats=repeats, controller=controller, gpu=gpu, out=out_dir,
                     profiles=str(profiles) if profiles else None, cost_model=cost_model,
                     batch_sizes=list(sizes) if sizes else None, engine=engine,
                     engine_args=parse_engine_args(engine_args), knobs=parse_sets(set_ or []))
        saved = RunDir.resume(resume)[1] if resume else None
        plan = resolve(load_config_file(config) if config else {}, flags, saved)
        cfg = plan.config

        from specbench.benchmark.pipeline import run_benchmark
        from specbench.core.strict_json import dumps
        from specbench.measure.lossless import mismatch_detail
        from specbench.output.batch_tables import batch_frames, render_frame

        def how_to_resume(run_dir: Path) -> str:
            return f"resume it with: specbench run --resume {shlex.quote(str(run_dir))}"

        before = (f"interrupted before anything new was measured; {how_to_resume(resume)}" if resume else
                  "interrupted before anything was measured")
        with interruptible(lambda stop: how_to_resume(stop.path), before), \
                progress_bar() as bar:
            task = bar.add_task("prompts", total=None, detail="loading models")

            def advance(prompt_id: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, detail=prompt_id)

            def estimate(plan: dict) -> None:
                bar.update(task, total=plan["prompts"], detail="timing forwards for the cost model" if cfg.cost_model else "")
                err.print(f"started in {plan['startup_s']:.1f} s (models loaded, warm-up; nothing is compiled); "
                          f"measuring {plan['prompts']} prompts x {plan['strategies']} strategies (ar included): "
                          f"about {plan['seconds']:.0f} s, estimated from the warm-up", highlight=False, soft_wrap=True)
                if plan["skipped"]:
                    err.print(f"warning: {len(plan['skipped'])} prompt(s) skipped: with the answer they would not fit "
                              f"the model's context of {plan['context']} tokens", style="yellow", highlight=False, soft_wrap=True)
                if plan["busy"]:
                    err.print(f"warning: the machine is busy before the run (load {plan['load']:.1f} on "
                              f"{plan['cpus']} CPUs): timings will be noisy", style="yellow", highlight=False, soft_wrap=True)

            result = run_benchmark(plan, advance, resume, estimate)
        for report in result.engines:
            for name, seconds in report.start_s.items():
                compiled = (f" ({compiling(report.details['compile_s'].get(name))})"
                            if "compile_s" in report.details else "")
                err.print(f"{report.engine} engine for {name} started in {seconds:.0f} s{compiled}", highlight=False)
        for note in result.notes:
            err.print(f"note: {note}", highlight=False, soft_wrap=True)
        if as_json:
            sys.stdout.write(dumps(result.as_json(), indent=2) + "\n")
            return
        print_report([result], table_format("table"), wide)
        for title, frame in batch_frames(result.summary, result.load).items():
            print_table(render_frame(frame, title, markdown=table_format("table") == "markdown"))
        for r in result.summary:
            stops = r.projection.by_batch if r.projection else None
            if stops and r.strategy != BASELINE:
                where = (f"stops paying at batch size {stops['stops_paying_at']}" if stops["stops_paying_at"]
                         else f"still pays at batch size {stops['points'][-1]['batch_size']}")
                err.print(f"projected on {stops['gpu']}: {r.strategy} {where}", highlight=False)
        if result.load and not result.load.modelled and cfg.batch_sizes != [1]:
            err.print(f"note: {result.load.note}", highlight=False)
        if cfg.temperature == 0:
            for r in result.summary:
                if r.mismatches:
                    at = f" at batch size {r.batch_size}" if r.batch_size > 1 else ""
                    where = "" if r.engine == SPECBENCH else f" in {r.engine}"
                    err.print(f"LOSSLESS CHECK FAILED: {r.strategy}{where}{at}: {r.mismatches} of {r.prompts} "
                              f"greedy outputs differ from ar{where}"
                              + mismatch_detail(r.first_divergence, r.divergence_margin),
                              style="bold red", highlight=False, soft_wrap=True)
            margins = {r.engine: r.engine_agreement["divergence_margin"] for r in result.summary if r.engine_agreement}
            for pair in result.engine_pairs:
                if pair.prompts:  # specbench's forward gives the margins where specbench is one of the two
                    margin = margins.get(pair.engine, []) if pair.reference == SPECBENCH else []
                    err.print(f"engines: {pair.engine}'s ar and {pair.reference}'s agree on {pair.agreeing} of "
                              f"{pair.prompts} greedy outputs"
                              + (mismatch_detail(pair.first_divergence, margin) if pair.first_divergence else ""),
                              highlight=False, soft_wrap=True)
        err.print(f"results: {result.path}", highlight=False)
