"""`specbench tune`: Optuna search of strategy knobs (specbench.tune does the work)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from optuna.trial import FrozenTrial

from specbench.cli import options
from specbench.cli.app import app, err, given, interruptible, out, progress_bar, split_list, user_errors, write_page
from specbench.core.strict_json import dumps
from specbench.engines.engine_registry import parse_engine_args
from specbench.methods.names import DEFAULT_STRATEGIES
from specbench.serving.serve_config import parse_slo
from specbench.tuning.study_config import OBJECTIVES

if TYPE_CHECKING:
    from specbench.tuning.trials import TuneReport


@app.command()
def tune(
    strategy: Annotated[Optional[str], typer.Option("--strategy", "-s", help="Strategy to tune: ngram, dspark, eagle+dflash, ... ; without it each of the default set is tuned in its own study and ranked.", show_default=",".join(DEFAULT_STRATEGIES))] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="Tune on real vLLM servers at this closed-loop load: every trial starts `vllm serve` with its knobs and measures one level.", show_default="one request at a time, in process")] = None,
    request_rate: Annotated[Optional[float], typer.Option("--request-rate", help="Tune on real vLLM servers at this open-loop load (requests per second, Poisson arrivals).", show_default="none")] = None,
    slo: Annotated[Optional[str], typer.Option("--slo", help="With a load: the objective is the goodput at these latency targets in ms, e.g. ttft=500,tpot=50,e2e=5000.", show_default="TPOT p50 (lowest)")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile: the objective becomes the projected speedup there (unless it is the local GPU), with its memory as a constraint.", show_default="measured here")] = None,
    model: options.Model = None,
    drafter: options.Drafters = None,
    suite: options.Suite = None,
    dataset: options.Dataset = None,
    multi_turn: options.MultiTurn = None,
    categories: options.Categories = None,
    limit: options.Limit = None,
    max_new_tokens: options.MaxNewTokens = None,
    temperature: options.Temperature = None,
    trials: Annotated[int, typer.Option(help="Trials of the study in total, across workers, machines and resumptions (split between strategies).")] = 30,
    timeout: Annotated[Optional[float], typer.Option(help="Stop each worker after this many seconds.", show_default="no limit")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name; the same name resumes it.", show_default="strategy-model-GPU-workload hash")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage: sqlite:///FILE, postgresql+psycopg://..., or a journal file path.", show_default="sqlite:///OUT/tuning/studies.db")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes on this machine, sharing the study's storage.")] = 1,
    objectives: Annotated[str, typer.Option(help=f"{' or '.join(OBJECTIVES)}: the latter gives the Pareto front of speedup against the memory needed.")] = "speedup",
    holdout: Annotated[float, typer.Option(help="Fraction of the prompts held out of the study and used to check the best configuration against the defaults.")] = 0.25,
    seed: options.Seed = None,
    heartbeat: Annotated[int, typer.Option(help="RDB storages: seconds between a worker's heartbeats; a trial silent for twice this is failed and retried.")] = 30,
    device: options.Device = None,
    dtype: options.Dtype = None,
    profiles: options.Profiles = None,
    engine: options.Engine = None,
    engine_args: options.EngineArgs = None,
    out_dir: options.ResultsDir = None,
    config: options.ConfigFile = None,
    as_json: options.Json = False,
    html: options.Html = False,
) -> None:
    """Search strategy knobs with Optuna: fastest settings for this model, hardware and workload.

    A --config file gives the workload: its knobs and controller are held fixed, its strategies tuned unless
    --strategy is given. Above temperature 0 every trial still checks losslessness greedily on one prompt.
    With --engine vllm the knobs vLLM takes are searched and the winning --speculative-config JSON is written.
    With --concurrency or --request-rate they are searched on real `vllm serve` servers at that load.
    """
    with user_errors():
        flags = given(
            model=model, drafters=[str(d) for d in drafter or []], suite=suite, dataset=dataset,
            multi_turn=multi_turn, categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens,
            temperature=temperature, seed=seed, dtype=dtype,
            device=device, gpu=gpu, out=out_dir, profiles=str(profiles) if profiles else None, engine=engine,
            engine_args=parse_engine_args(engine_args), timeout=timeout, study=study, storage=storage,
            concurrency=concurrency, request_rate=request_rate)
        report = run_studies(strategy or (), config, dict(
            flags, trials=trials, workers=workers, objectives=objectives, holdout=holdout, heartbeat_s=heartbeat,
            slo=parse_slo(slo)))
        if html:
            write_studies_page(report)
    show(report, as_json)


def show(report: TuneReport, as_json: bool) -> None:
    """The studies' JSON, or their tables: rich on a terminal, markdown where piped."""
    from specbench.report.tune_report import render_markdown, render_rich

    if as_json:
        sys.stdout.write(dumps(report.as_json(), indent=2) + "\n")
    elif out.is_terminal:
        out.print(render_rich(report))
    else:
        sys.stdout.write(render_markdown(report))


def write_studies_page(report: TuneReport) -> None:
    """The page of the studies with a best configuration, beside the first one's record: <out>/tuned/<study>.html."""
    records = [Path(record.toml).with_suffix(".json") for record in report.studies if record.toml]
    if records:
        write_page(records, records[0].with_suffix(".html"))


def run_studies(strategy: str | tuple, config: Path | None, settings: dict[str, Any]) -> TuneReport:
    """The studies (specbench.tune), with a progress bar per study (a line per finished trial where stderr is no
    terminal); an interruption says how to resume. Every check that needs no model comes first (storage, named
    studies): refused before torch loads."""
    import specbench

    with interruptible(lambda stop: "run the same command to resume it",
                       "interrupted: the trials finished so far are kept in the study; run the same command to "
                       "resume it"), progress_bar() as bar:
        tasks: dict[str, int] = {}
        loading = bar.add_task("tune", total=None, detail="loading the model and measuring ar")

        def advance(name: str, done: int, total: int, best: float | None, trial: FrozenTrial) -> None:
            bar.update(loading, visible=False)
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total, detail="")
            bar.update(tasks[name], completed=done, detail=f"best {best:.3f}" if best is not None else "")
            if not err.is_terminal:  # no bar there (CI logs, `| tee`): one line per finished trial
                value = f"{trial.values[0]:.3f}" if trial.values else "-"
                so_far = f"{best:.3f}" if best is not None else "none yet"
                err.print(f"{name}: trial {trial.number} {trial.state.name.lower()}, value {value}, "
                          f"best {so_far} ({done} of {total} trials)", highlight=False, soft_wrap=True)

        def checked() -> None:
            if not err.is_terminal:
                err.print("tune: loading the model and measuring ar", highlight=False)

        return specbench.tune(strategy, config, advance, checked, **settings)
