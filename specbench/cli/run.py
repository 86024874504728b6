"""`specbench run`: every strategy against plain decoding on a prompt suite."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.app import (
    app,
    err,
    print_report,
    print_table,
    progress_bar,
    size_list,
    split_list,
    table_format,
    user_errors,
)
from specbench.errors import SpecbenchError


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
    batch_size: Annotated[Optional[int], typer.Option(help="Decode the prompts B at a time, in lockstep (ar and the chain strategies: ngram, draft, dflash, dspark).")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option(help="Several batch sizes, each in turn, e.g. 1,4,16: a column per batch size.")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Results directory (default results/).")] = None,
    config: Annotated[Optional[Path], typer.Option(help="TOML config file; flags override it.")] = None,
    resume: Annotated[Optional[Path], typer.Option(help="Resume an interrupted run directory.")] = None,
    cost_model: Annotated[Optional[bool], typer.Option("--cost-model/--no-cost-model", help="Time the forwards the cost model predicts from (first run only; stored in results/costs/).")] = None,
    wide: Annotated[bool, typer.Option(help="Every column: time shares, memory, cost model, projection, NVML.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Run strategies against plain autoregressive decoding on a prompt suite."""
    from specbench.batch_tables import batch_frames, render_frame
    from specbench.bench import run_benchmark
    from specbench.config import check_sizes, load_config_file, resolve
    from specbench.measure.lossless import mismatch_detail
    from specbench.report import load_runs
    from specbench.strategies.knobs import parse_sets
    from specbench.strict_json import dumps

    with user_errors():
        if batch_size is not None and batch_sizes is not None:
            raise SpecbenchError("give --batch-size or --batch-sizes, not both")
        sizes = (batch_size,) if batch_size is not None else size_list(batch_sizes, "--batch-sizes")
        if sizes is not None:
            check_sizes(sizes, "--batch-sizes")
        flags = dict(model=model, drafters=[str(d) for d in drafter or []], strategies=strategy or None,
                     suite=suite, categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, dtype=dtype, device=device,
                     warmup=warmup, repeats=repeats, controller=controller, gpu=gpu, out=out_dir,
                     profiles=str(profiles) if profiles else None, cost_model=cost_model,
                     batch_sizes=list(sizes) if sizes else None,
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
        for note in report.extra.get("notes", []):
            err.print(f"note: {note}", highlight=False)
        if as_json:
            sys.stdout.write(dumps(report.as_json(), indent=2) + "\n")
            return
        runs, _ = load_runs([report.run_dir])
        print_report(runs, table_format("table"), wide)
        for title, frame in batch_frames(report.results, report.extra.get("load", {})).items():
            print_table(render_frame(frame, title, markdown=table_format("table") == "markdown"))
        for r in report.results:
            stops = (r.get("projection") or {}).get("by_batch")
            if stops and r["strategy"] != "ar":
                where = (f"stops paying at batch size {stops['stops_paying_at']}" if stops["stops_paying_at"]
                         else f"still pays at batch size {stops['points'][-1]['batch_size']}")
                err.print(f"projected on {stops['gpu']}: {r['strategy']} {where}", highlight=False)
        if report.extra.get("load", {}).get("note") and cfg.batch_sizes != [1]:
            err.print(f"note: {report.extra['load']['note']}", highlight=False)
        if cfg.temperature == 0:
            for r in report.results:
                if r["mismatches"]:
                    err.print(f"LOSSLESS CHECK FAILED: {r['strategy']} at batch size {r['batch_size']}: "
                              f"{r['mismatches']} of {r['prompts']} greedy outputs differ from ar"
                              + mismatch_detail(r["first_divergence"], r["divergence_margin"]),
                              style="bold red", highlight=False)
        err.print(f"results: {report.run_dir}", highlight=False)
