"""Speculation under load on the embedded default model (or --model): every strategy vLLM runs here on its
own real `vllm serve`, at closed-loop concurrency 1, 2, 4, 8 and 16, against `ar`'s server at the same load.

The same pipeline as `specbench serve` (its run directory goes under results/serve/), then the figures:
each level's table, where each strategy stops paying (the crossover), and the per-load setting exported
as vLLM's speculative config (num_speculative_tokens_per_batch_size). Run it on a quiet machine: every
figure is a latency.

Writes results/benchmarks/serve.{json,md} (--name NAME: NAME.{json,md}) and the two plots beside them.

    python scripts/bench_serve.py --max-new-tokens 64
    python scripts/bench_serve.py --model smollm2-135m --name serve-smollm2 --strategies ngram,eagle --max-new-tokens 64
    python scripts/bench_serve.py --model smollm2-135m --name serve-smollm2-sharegpt --strategies ngram,eagle \
        --dataset sharegpt --concurrency 1,4,16 --max-new-tokens 64
    python scripts/bench_serve.py --smoke --out /tmp/serve-smoke     # minutes: ngram, concurrency 1,2
"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

from rich.console import Console

from specbench.core.files import write_atomic, write_json
from specbench.core.strict_json import dumps
from specbench.decoding.target import DEFAULT_MODEL
from specbench.report.serve_tables import LEGEND, decisions, level_tables
from specbench.serving.serve_config import serve_config
from specbench.serving.serve_dir import ServeRun
from specbench.serving.sweep import plan, serve_sweep, strategy_names

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ["ngram", "draft", "eagle", "dflash"]  # what vLLM's CPU model runner runs for this target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, help="prompts (default: one per request of the largest level)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="among " + ", ".join(STRATEGIES))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks", help="where the figures go")
    parser.add_argument("--smoke", action="store_true", help="ngram at concurrency 1,2: checks the script")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="as `specbench serve --model` takes it")
    parser.add_argument("--name", default="serve", help="the files' name: NAME.json, NAME.md, NAME_<plot>.png")
    parser.add_argument("--dataset", help="`sharegpt` (or a file in its layout): its prompts instead of the suite's")
    args = parser.parse_args()
    strategies, levels = args.strategies.split(","), [int(c) for c in args.concurrency.split(",")]
    results = ROOT / "results"
    if args.smoke:
        strategies, levels, args.max_new_tokens, results = ["ngram"], [1, 2], 16, args.out
    config = serve_config({"model": args.model, "strategies": strategies, "max_new_tokens": args.max_new_tokens,
                           "out": str(results), "limit": args.limit}, concurrency=levels, dataset=args.dataset)
    model = "the embedded model" if args.model == DEFAULT_MODEL else args.model
    run = ServeRun.create(config, strategy_names(config), model, config.run.suite)
    result = serve_sweep(run, plan(config), lambda name, level, done, total: print(
        f"\r{name} {level.label}: {done}/{total}", end="", flush=True))
    print()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{args.name}.json", result.as_json())
    for png in ("tpot_vs_concurrency.png", "pareto.png"):
        if (run.path / "plots" / png).is_file():
            shutil.copyfile(run.path / "plots" / png, args.out / f"{args.name}_{png}")
    console = Console(record=True, width=80, file=io.StringIO())
    for table in level_tables(result.levels, slo=False):
        console.print(table)
    where = run.path.relative_to(ROOT) if run.path.is_relative_to(ROOT) else run.path
    lines = [f"# Speculation under load ({model}, CPU, vllm serve per strategy)", "",
             f"Closed loop at concurrency {', '.join(map(str, levels))}; {config.run.limit} "
             f"{'ShareGPT ' if args.dataset else ''}prompts, each request its own, {args.max_new_tokens} new tokens, "
             f"greedy. Run directory: {where}",
             "", "```", console.export_text().rstrip(), "```", "", LEGEND, "",
             *[f"- {line}" for line in decisions(result.strategies, result.levels)], "",
             "## Exported schedules (vLLM speculative_config)", "", "```json",
             dumps(result.schedules, indent=2), "```", ""]
    lines += [f"Note: {note}" for note in result.notes]
    write_atomic(args.out / f"{args.name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
