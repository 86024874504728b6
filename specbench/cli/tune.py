"""`specbench tune`: Optuna search of strategy knobs (specbench.tuning.run.tune does the work)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from optuna.trial import FrozenTrial

from specbench.cli.app import app, err, interruptible, out, progress_bar, split_list, user_errors
from specbench.cli.run import default
from specbench.config import load_config_file, resolve
from specbench.engines import parse_engine_args
from specbench.strategies.spec import DEFAULT_STRATEGIES
from specbench.strict_json import dumps
from specbench.tuning.config import OBJECTIVES, TuneConfig
from specbench.tuning.study import open_checked


@app.command()
def tune(
    strategy: Annotated[Optional[str], typer.Option("--strategy", "-s", help="Strategy to tune: ngram, dspark, eagle+dflash, ... ; without it each of the default set is tuned in its own study and ranked.", show_default=",".join(DEFAULT_STRATEGIES))] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile: the objective becomes the projected speedup there (unless it is the local GPU), with its memory as a constraint.", show_default="measured here")] = None,
    model: Annotated[Optional[str], typer.Option(help="HF model id (from the local cache) or local directory.", show_default="the embedded model")] = None,
    drafter: Annotated[Optional[list[Path]], typer.Option(help="Drafter directory (repeatable).", show_default="the embedded model's drafters")] = None,
    suite: Annotated[Optional[str], typer.Option(help="Built-in suite name or a suite file.", show_default=default("suite"))] = None,
    categories: Annotated[Optional[list[str]], typer.Option("--categories", "--category", help="Only these categories (repeatable or comma list).", show_default="all")] = None,
    limit: Annotated[Optional[int], typer.Option(help="At most N prompts (tuning and held-out together), spread over the categories.", show_default="the whole suite")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="New tokens per answer.", show_default=default("max_new_tokens"))] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 = greedy; above 0 every trial still checks losslessness greedily on one prompt.", show_default=default("temperature"))] = None,
    trials: Annotated[int, typer.Option(help="Trials of the study in total, across workers, machines and resumptions (split between strategies).")] = 30,
    timeout: Annotated[Optional[float], typer.Option(help="Stop each worker after this many seconds.", show_default="no limit")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name; the same name resumes it .", show_default="strategy-model-GPU-workload hash")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage: sqlite:///FILE, postgresql+psycopg://..., or a journal file path .", show_default="sqlite:///OUT/tuning/studies.db")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes on this machine, sharing the study's storage.")] = 1,
    objectives: Annotated[str, typer.Option(help=f"{' or '.join(OBJECTIVES)}: the latter gives the Pareto front of speedup against the memory needed.")] = "speedup",
    holdout: Annotated[float, typer.Option(help="Fraction of the prompts held out of the study and used to check the best configuration against the defaults.")] = 0.25,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the prompt split, the shuffles and the sampler.", show_default=default("seed"))] = None,
    heartbeat: Annotated[int, typer.Option(help="RDB storages: seconds between a worker's heartbeats; a trial silent for twice this is failed and retried.")] = 30,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu or cuda.", show_default=default("device"))] = None,
    dtype: Annotated[Optional[str], typer.Option(help="auto, float32, bfloat16 or float16.", show_default=default("dtype"))] = None,
    profiles: Annotated[Optional[Path], typer.Option(help="TOML file with extra GPU profiles.", show_default="none")] = None,
    engine: Annotated[Optional[str], typer.Option(help="specbench or vllm: the engine every trial measures in (vllm searches the knobs vLLM takes and writes the winning --speculative-config JSON).", show_default=default("engine"))] = None,
    engine_args: Annotated[Optional[str], typer.Option(help="vLLM engine arguments as a JSON object (with --engine vllm).", show_default="none")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Results directory (default results/): tuned/ and tuning/ go there.", show_default=default("out"))] = None,
    config: Annotated[Optional[Path], typer.Option(help="Run config TOML (as `run` reads): the workload; its knobs and controller are held fixed, its strategies tuned unless --strategy is given.", show_default="none")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the summary.")] = False,
) -> None:
    """Search strategy knobs with Optuna: fastest settings for this model, hardware and workload."""
    with user_errors():
        # every check that needs no model comes first (storage, named studies): refused before torch loads
        file_values = load_config_file(config) if config else {}
        strategies = (strategy,) if strategy else tuple(file_values.get("strategies", ()))
        flags = dict(strategies=list(strategies) or None, model=model, drafters=[str(d) for d in drafter or []], suite=suite,
                     categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens,
                     temperature=temperature, seed=seed, dtype=dtype, device=device, gpu=gpu, out=out_dir,
                     profiles=str(profiles) if profiles else None, engine=engine,
                     engine_args=parse_engine_args(engine_args))
        cfg = TuneConfig(resolve(file_values, flags), strategies, trials, timeout, study, storage, workers,
                         objectives, holdout, heartbeat).validate()
        open_checked(cfg)

        from specbench.tuning.run import tune as run_tune
        from specbench.tuning.summary import render_markdown, render_rich

        with interruptible(lambda stop: "run the same command to resume it", "interrupted: the trials finished so far are kept in the study; "
                                            "run the same command to resume it"), progress_bar() as bar:
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

            if not err.is_terminal:
                err.print("tune: loading the model and measuring ar", highlight=False)
            report = run_tune(cfg, advance)
    if as_json:
        sys.stdout.write(dumps(report.as_json(), indent=2) + "\n")
    elif out.is_terminal:
        out.print(render_rich(report))
    else:
        sys.stdout.write(render_markdown(report))
