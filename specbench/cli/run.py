"""`specbench run`: every strategy against plain decoding on a prompt suite."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.app import app, err, print_report, progress_bar, split_list, table_format, user_errors


@app.command()
def run(
    model: Annotated[Optional[str], typer.Option(help="HF model id or local directory (default: the embedded model).")] = None,
    drafter: Annotated[Optional[list[str]], typer.Option(help="Drafter: a directory or hub id in specbench's, EAGLE-3, DFlash (z-lab) or DeepSpec format, or a causal LM for `draft` (repeatable; the format is detected).")] = None,
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
    cost_model: Annotated[Optional[bool], typer.Option("--cost-model/--no-cost-model", help="Time the forwards the cost model predicts from (first run only; stored in results/costs/).")] = None,
    wide: Annotated[bool, typer.Option(help="Every column: time shares, memory, cost model, projection, NVML.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Run strategies against plain autoregressive decoding on a prompt suite."""
    from specbench.bench import run_benchmark
    from specbench.config import load_config_file, resolve
    from specbench.measure.lossless import mismatch_detail
    from specbench.report import load_runs
    from specbench.strategies.knobs import parse_sets
    from specbench.strict_json import dumps

    with user_errors():
        flags = dict(model=model, drafters=[str(d) for d in drafter or []], strategies=strategy or None,
                     suite=suite, categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, dtype=dtype, device=device,
                     warmup=warmup, repeats=repeats, controller=controller, gpu=gpu, out=out_dir,
                     profiles=str(profiles) if profiles else None, cost_model=cost_model,
                     knobs=parse_sets(set_ or []))
        cfg = resolve(load_config_file(config) if config else {}, flags)
        with progress_bar() as bar:
            task = bar.add_task("prompts", total=None, detail="loading models")

            def advance(prompt_id: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, detail=prompt_id)

            def estimate(seconds: float, prompts: int, strategies: int) -> None:
                bar.update(task, total=prompts, detail="timing the cost model's forwards" if cfg.cost_model else "")
                err.print(f"measuring {prompts} prompts x {strategies} strategies (ar included): about "
                          f"{seconds:.0f} s, estimated from the warm-up", highlight=False)

            try:
                report = run_benchmark(cfg, advance, resume, estimate)
            except KeyboardInterrupt:
                err.print("interrupted: the prompts finished so far are kept; the run is marked incomplete "
                          "(resume it with `specbench run --resume RUN_DIR`)", highlight=False)
                raise typer.Exit(130) from None
        if as_json:
            sys.stdout.write(dumps(report.as_json(), indent=2) + "\n")
            return
        runs, _ = load_runs([report.run_dir])
        print_report(runs, table_format("table"), wide)
        if cfg.temperature == 0:
            for r in report.results:
                if r["mismatches"]:
                    err.print(f"LOSSLESS CHECK FAILED: {r['strategy']}: {r['mismatches']} of {r['prompts']} greedy "
                              "outputs differ from ar" + mismatch_detail(r["first_divergence"], r["divergence_margin"]),
                              style="bold red", highlight=False)
        err.print(f"results: {report.run_dir}", highlight=False)
