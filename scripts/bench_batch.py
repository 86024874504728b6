"""Batch-size benchmark on the embedded default model, CPU, greedy.

1. `specbench costs`' default grid for the target and the ngram, dflash and dspark drafters (batch
   1..32 x verify length 1..16 x context 128 and 1024), stored under results/costs/ and reused.
2. One `specbench run` of ngram, dflash and dspark at batch sizes 1, 4 and 16, each over batched
   `ar` at the same batch size, with the lossless check on every sequence.
3. The figures: measured speedup beside the modelled one (the cost table with the run's acceptance
   and draft sizes at batch 1), measured / modelled, the batch size where each strategy stops paying
   on this CPU (measured at the run's batch sizes, modelled over the table's), and the modelled
   crossover on the rtx4090 and h100-sxm profiles (roofline projection, marked modelled).

Writes results/benchmarks/batch.{json,md} and the two plots beside them.

    python scripts/bench_batch.py --limit 48 --max-new-tokens 64
    python scripts/bench_batch.py --smoke --out /tmp/batch-smoke     # minutes: a tiny grid and run
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from specbench.analysis.cost_table import BATCH_GRID
from specbench.analysis.hardware import BUILTIN_PROFILES
from specbench.analysis.projection import by_batch, workload_shape
from specbench.bench.cost_timing import measure_target_costs
from specbench.bench.pipeline import run_benchmark
from specbench.bench.prepare import prepare
from specbench.core.files import write_atomic, write_json
from specbench.decoding.target import load_target
from specbench.plan.run_config import RunConfig
from specbench.report.batch_tables import batch_frames, render_frame, stop_text

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("ngram", "dflash", "dspark")
GPUS = ("rtx4090", "h100-sxm")
SMOKE_GRID = replace(BATCH_GRID, batch_sizes=(1, 2, 4), verify_lengths=(1, 4, 8), context_lens=(64,), repeats=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=48, help="prompts (a multiple of 16 keeps every batch full)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks", help="where the figures go")
    parser.add_argument("--smoke", action="store_true", help="a tiny cost grid, for checking the script")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--drafter", action="append", default=[], help="repeatable (default: the model's drafters)")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    results_dir = ROOT / "results" if not args.smoke else args.out
    args.out.mkdir(parents=True, exist_ok=True)

    target = load_target(args.model, torch.device("cpu"), torch.float32)
    table, table_file = measure_target_costs(target, args.drafter, results_dir,
                                             SMOKE_GRID if args.smoke else BATCH_GRID, strategies)
    config = RunConfig(model=args.model, drafters=args.drafter, strategies=strategies, limit=args.limit,
                       max_new_tokens=args.max_new_tokens, batch_sizes=batch_sizes, device="cpu",
                       out=str(results_dir))
    report = run_benchmark(config.plan())
    load = report.load
    figures = {
        "command": f"python scripts/bench_batch.py --limit {args.limit} --max-new-tokens {args.max_new_tokens} "
                   f"--batch-sizes {args.batch_sizes}" + (f" --model {args.model}" if args.model else ""),
        "model": args.model or "the embedded default model",
        "run_dir": str(report.path), "cost_table": str(table_file), "complete": report.complete,
        "mismatches": {f"{r.strategy}@{r.batch_size}": r.mismatches for r in report.summary},
        "measured_beside_modelled": [p.as_dict() for p in load.points if p.measured_speedup is not None],
        "modelled": [p.as_dict() for p in load.points],
        "stops_paying_on_this_cpu": load.stops_paying,
        "best_draft_tokens": load.schedule, "vllm": load.vllm,
        "gpu_crossover_modelled": gpu_crossovers(config, report),
        "noise": report.noise.as_dict(),
    }
    write_json(args.out / "batch.json", figures)
    write_atomic(args.out / "batch.md", markdown(figures, report) + "\n")
    for plot, name in (("speedup_by_batch.png", "batch_speedup.png"), ("verify_cost.png", "batch_verify_cost.png")):
        if (report.path / plot).is_file():
            shutil.copy(report.path / plot, args.out / name)
    print((args.out / "batch.md").read_text())


def gpu_crossovers(config: RunConfig, report) -> dict[str, dict]:
    """Per strategy and GPU profile: the projected speedup by batch size and where it falls below 1."""
    bench = prepare(config.plan())
    rows = pd.read_parquet(report.path / "rows.parquet")
    smallest = int(rows.batch_size.min())
    rows = rows[rows.batch_size == smallest]
    out: dict[str, dict] = {}
    for strategy in bench.strategies:
        if strategy.drafter is None:
            continue
        shape = workload_shape(bench.target.model, strategy.drafter, rows[rows.strategy == strategy.name])
        out[strategy.name] = {gpu: by_batch(shape, BUILTIN_PROFILES[gpu]) for gpu in GPUS}
    return out


def markdown(figures: dict, report) -> str:
    lines = ["# Batch-size benchmark", "", f"`{figures['command']}` (CPU, greedy, {figures['model']})", "",
             f"Run: `{figures['run_dir']}`; cost table: `{figures['cost_table']}`.", ""]
    if report.noise.noisy:
        lines += [f"**The machine was noisy** ({'; '.join(report.noise.reasons)}): rerun on a quiet machine.", ""]
    for title, frame in batch_frames(report.summary, report.load).items():
        lines.append(render_frame(frame, f"## {title}", markdown=True))
    lines += ["## Measured / modelled", "",
              "Rows: the mean sequences still active per batched step (measured; modelled from the sequences' "
              "step counts at batch 1). Continuous: the modelled speedup of a batch refilled from the queue "
              "(a fixed concurrency), which this engine does not run.", "",
              "| strategy | batch | measured | modelled | measured / modelled | rows | modelled rows | continuous |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p['strategy']} | {p['batch_size']} | {p['measured_speedup']:.2f}x | {p['modelled_speedup']:.2f}x | "
              f"{p['measured_over_modelled']:.2f} | {p['measured_rows']:.1f} | {p['modelled_rows']:.1f} | "
              f"{p['continuous_speedup']:.2f}x |" for p in figures["measured_beside_modelled"]]
    within = sum(abs(p["measured_over_modelled"] - 1) <= 0.15 for p in figures["measured_beside_modelled"])
    lines += ["", f"Within 15%: {within} of {len(figures['measured_beside_modelled'])} cells.", ""]
    lines += ["", "## Where speculation stops paying on a GPU (modelled: roofline projection of the measured shape)",
              "", "| strategy | " + " | ".join(GPUS) + " |", "|---|" + "---|" * len(GPUS)]
    for name, by_gpu in figures["gpu_crossover_modelled"].items():
        cells = [stop_text(g["stops_paying_at"], g["points"][-1]["batch_size"]) for g in by_gpu.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## vLLM schedules (num_speculative_tokens_per_batch_size, modelled)", "", "```json",
              json.dumps(figures["vllm"], indent=2), "```", "", "## Lossless check", "",
              "Greedy mismatches against ar (batched ar against batch size 1): "
              + ", ".join(f"{k} {v}" for k, v in figures["mismatches"].items())]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
