"""Run-to-run stability: the same `specbench run` repeated, and the spread of each figure across the runs.

Each round runs the configuration once per mode: as deployed (vLLM with the preloads its CPU guide asks for,
engines/vllm_cpu.py) and, with `--preload both`, again without them (SPECBENCH_VLLM_PRELOAD=0); rounds
alternate the modes so that a drift of the machine falls on both. Per mode and strategy: the speedup of each
run, its spread (max - min over the median: the issue's target is within +-10%, a spread of 0.20), the prompts
measured again as outliers, and the largest time per token of a prompt not measured again over its strategy's
median (the target: under 3); then specbench's `ar` over vLLM's `ar` in tokens/s, run by run, with its spread.
Writes results/benchmarks/NAME.{json,md} (default stability), or under --out DIR.

    # the issue's command, three times in a row
    python scripts/bench_stability.py --engine both --strategies ngram,dflash --limit 8 --max-new-tokens 64
    # the engines table's configuration, three times, with and without the preloads
    python scripts/bench_stability.py --engine both --strategies ngram,draft,eagle,dflash --limit 16 \\
        --max-new-tokens 64 --preload both --name stability-engines
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specbench.analysis.stats import run_spread, unflagged_excess
from specbench.bench.pipeline import run_benchmark
from specbench.core.engine_names import label
from specbench.core.files import write_atomic, write_json
from specbench.decoding.target import DEFAULT_MODEL
from specbench.engines.vllm_cpu import SWITCH
from specbench.methods.names import BASELINE
from specbench.plan.run_config import RunConfig

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
MODES = {"deployed": None, "no-preload": "0"}  # SPECBENCH_VLLM_PRELOAD in each mode


def one_run(args: argparse.Namespace, mode: str) -> dict:
    """One run in `mode`: its figures per strategy, and its `ar` tokens/s per engine."""
    switch = MODES[mode]
    before = os.environ.pop(SWITCH, None)
    if switch is not None:
        os.environ[SWITCH] = switch
    try:
        result = run_benchmark(RunConfig(strategies=args.strategies.split(","), engine=args.engine, limit=args.limit,
                                         model=args.model, max_new_tokens=args.max_new_tokens, device="cpu",
                                         out=str(args.out.parent), engine_args=json.loads(args.engine_args or "{}"),
                                         cost_model=False).plan())
    finally:
        os.environ.pop(SWITCH, None)
        if before is not None:
            os.environ[SWITCH] = before
    runtime = next((r.details.get("cpu_runtime") for r in result.engines if r.engine == "vllm"), None)
    return {"run_dir": str(result.path), "mode": mode, "noise": result.noise.reasons if result.noise else [],
            "cpu_runtime": runtime, "notes": result.notes,
            "strategies": {label(s.strategy, s.engine): {"speedup": s.speedup, "tokens_per_s": s.tokens_per_s,
                                                         "outliers": len(s.outliers or [])}
                           for s in result.summary},
            "ar_tokens_per_s": {s.engine: s.tokens_per_s for s in result.summary if s.strategy == BASELINE},
            "unflagged_excess": unflagged_excess(result.frame())}


def spread_table(runs: list[dict], mode: str) -> tuple[dict, list[str]]:
    """The figures of `mode`'s runs across the runs, and their Markdown table."""
    mine = [r for r in runs if r["mode"] == mode]
    labels = list(mine[0]["strategies"])
    figures = {}
    lines = [f"### {mode}", "", "| strategy | speedup per run | spread | outliers per run | worst unflagged |",
             "|---|---|---|---|---|"]
    for name in labels:
        speedups = [r["strategies"][name]["speedup"] for r in mine]
        outliers = [r["strategies"][name]["outliers"] for r in mine]
        worst = max(r["unflagged_excess"].get(name, 0.0) for r in mine)
        spread = run_spread([s for s in speedups if s is not None]) if BASELINE not in name.split("@")[0] else None
        figures[name] = {"speedups": speedups, "spread": spread, "outliers": outliers, "worst_unflagged": worst}
        shown = ", ".join("-" if s is None else f"{s:.2f}" for s in speedups)
        lines.append(f"| {name} | {shown} | {'-' if spread is None else f'{spread:.1%}'} | "
                     f"{', '.join(map(str, outliers))} | {worst:.2f}x |")
    ratios = [r["ar_tokens_per_s"]["specbench"] / r["ar_tokens_per_s"]["vllm"] for r in mine
              if {"specbench", "vllm"} <= set(r["ar_tokens_per_s"])]
    if ratios:
        figures["specbench_ar_over_vllm_ar"] = {"per_run": ratios, "spread": run_spread(ratios)}
        lines += ["", f"specbench ar / vLLM ar, tokens/s: {', '.join(f'{r:.2f}' for r in ratios)} "
                  f"(spread {run_spread(ratios):.1%})"]
    return figures, lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="both")
    parser.add_argument("--strategies", default="ngram,dflash")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--preload", choices=("deployed", "both"), default="deployed",
                        help="both: each round runs again without vLLM's preloads (SPECBENCH_VLLM_PRELOAD=0)")
    parser.add_argument("--engine-args", default=None, help="JSON passed to vLLM, as `specbench run` takes it")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="as `specbench run --model` takes it")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--name", default="stability", help="the files' name: NAME.json and NAME.md")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    modes = ["deployed", "no-preload"] if args.preload == "both" else ["deployed"]
    runs = []
    for round_ in range(args.runs):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            runs.append(one_run(args, mode))
    figures: dict = {"runs": runs}
    lines = ["# Run-to-run stability", "", f"`python scripts/bench_stability.py --engine {args.engine} --strategies "
             f"{args.strategies} --limit {args.limit} --max-new-tokens {args.max_new_tokens} --runs {args.runs} "
             f"--preload {args.preload}` (CPU; spread: (max - min) / median of the runs; worst unflagged: the "
             "largest time per token of a prompt not measured again, over its strategy's median)", ""]
    for mode in modes:
        figures[mode], table = spread_table(runs, mode)
        lines += table
    lines += ["- noise: " + "; ".join(sorted({reason for r in runs for reason in r["noise"]}) or ["quiet"]),
              "- vLLM's preloads: " + "; ".join(sorted({json.dumps(r["cpu_runtime"]) for r in runs})), ""]
    write_json(args.out / f"{args.name}.json", figures)
    write_atomic(args.out / f"{args.name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
