"""Recommend benchmark: does `specbench recommend` pick the strategy that is fastest?

On the embedded default model (CPU, greedy, float32), for each category the built-in suite's prompts
are split in two halves (alternating). `--strategy all` runs on the first half (the evidence) and,
separately, on the second half (the check), at batch size 1; at batch size 4 the strategies that run
batched (`ar`, ngram, draft, dflash, dspark: token trees verify at batch 1 only) run the same way. For
each workload (category x batch size) `recommend`
answers from the evidence run alone, and the answer is compared with the measured fastest on the
check run: whether they are the same strategy, and by how much the recommendation loses when they
are not (its check speedup over the winner's). The prior's answer for the same workload is set
beside both, so the places where the measured winner contradicts the practitioners' rules show. The tree
learned from both runs is written too (`recommend --learn`), or its reason for not being fitted.

At batch 4 the evidence also holds the batch-1 run's load axis (every strategy modelled at batch 4
from the cost table); measured evidence ranks first, so the answer comes from the batch-4 run.

Writes results/benchmarks/recommend.{json,md} (--out); the runs go to a new folder under
results/bench_recommend/ (--work).

    python scripts/bench_recommend.py --categories code,chat --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from specbench.analysis.hardware import load_profiles
from specbench.analysis.stats import summarise_strategies
from specbench.bench.pipeline import run_benchmark
from specbench.core.files import write_atomic, write_json
from specbench.methods.build import verifies_trees
from specbench.methods.names import parse_strategies
from specbench.methods.published.formats import drafters_used_by
from specbench.plan.run_config import RunConfig
from specbench.plan.suites import load_suite
from specbench.recommender import evaluate, learn, make_workload, recommend
from specbench.recommender.evidence import Evidence, load_evidence
from specbench.report.comparison import load_runs

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "benchmarks"
WORK = ROOT / "results" / "bench_recommend"
BATCH_SIZES = (1, 4)


def write_halves(categories: list[str], per_half: int | None, work: Path) -> tuple[Path, Path]:
    """Two suite files (MT-bench JSONL): alternate prompts of each category, at most `per_half` each."""
    suite = load_suite("default")
    halves: tuple[list[str], list[str]] = ([], [])
    for category in categories:
        items = [item for item in suite.items if item.category == category]
        if not items:
            raise SystemExit(f"no {category} prompts in the default suite; it has {', '.join(suite.categories())}")
        for half, chosen in zip(halves, (items[0::2][:per_half], items[1::2][:per_half]), strict=True):
            half += [json.dumps({"question_id": i.id, "category": category, "turns": list(i.turns)}) for i in chosen]
    paths = (work / "evidence.jsonl", work / "check.jsonl")
    for path, lines in zip(paths, halves, strict=True):
        write_atomic(path, "\n".join(lines) + "\n")
    return paths


def strategies_at(batch: int) -> list[str]:
    """`all` at batch 1; above it, the strategies that do not verify token trees."""
    return ["all"] if batch == 1 else [s.name for s in parse_strategies(["all"]) if not verifies_trees(s)]


def measure(workload: RunConfig, suite: Path, out: Path, batch: int) -> Path:
    strategies = strategies_at(batch)
    drafters = drafters_used_by(workload.drafters, parse_strategies(strategies))
    report = run_benchmark(replace(workload, strategies=strategies, drafters=drafters, suite=str(suite), out=str(out),
                                   batch_sizes=[batch]).plan())
    return report.path


def check_speedups(run_dir: Path) -> dict[str, dict[str, float]]:
    """category -> strategy -> the check run's speedup over ar in that category."""
    runs, _ = load_runs([run_dir])
    table: dict[str, dict[str, float]] = {}
    for result in summarise_strategies(runs[0].frame(), by="category"):
        if result.speedup is not None:
            table.setdefault(result.category, {})[result.strategy] = result.speedup
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--categories", default="code,chat", help="Two (or more) categories of the default suite.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--per-half", type=int, default=None, help="Prompts per category in each half (default all).")
    parser.add_argument("--out", type=Path, default=OUT, help="Where recommend.{json,md} go.")
    parser.add_argument("--work", type=Path, default=WORK, help="Runs go to a new folder here.")
    parser.add_argument("--model", default=None, help="The target (default: the embedded model).")
    parser.add_argument("--drafter", action="append", default=[], help="Repeatable (default: the model's drafters).")
    args = parser.parse_args()
    categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    work = args.work / datetime.now().strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    evidence_suite, check_suite = write_halves(categories, args.per_half, work)
    workload = RunConfig(model=args.model, drafters=args.drafter, limit=None, max_new_tokens=args.max_new_tokens,
                         device="cpu", cost_model=False)
    evidence_runs = {b: measure(workload, evidence_suite, work / "evidence", b) for b in BATCH_SIZES}
    check_runs = {b: measure(workload, check_suite, work / "check", b) for b in BATCH_SIZES}
    evidence = load_evidence(work / "evidence")
    checks = {b: check_speedups(run) for b, run in check_runs.items()}

    workloads = []
    for category in categories:
        for batch in BATCH_SIZES:
            workload = make_workload("cpu", category, batch)
            rec = recommend(workload, work / "evidence", evidence)
            prior = evaluate(workload).strategy
            speedups = checks[batch][category]
            fastest = max(speedups, key=speedups.get)
            workloads.append({
                "category": category, "batch_size": batch,
                "recommended": rec.strategy, "source": rec.source, "expected_speedup": rec.speedup,
                "expected_ci": list(rec.ci) if rec.ci else None,
                "check_speedup": speedups.get(rec.strategy), "fastest_on_check": fastest,
                "fastest_speedup": speedups[fastest], "same": rec.strategy == fastest,
                "loss": speedups.get(rec.strategy, float("nan")) / speedups[fastest],
                "prior": prior, "prior_check_speedup": speedups.get(prior),
                "prior_contradicted": prior != fastest,
                "alternatives": [a.strategy for a in rec.alternatives],
            })
    both = Evidence(evidence.runs + load_evidence(work / "check").runs)
    learned = learn(both, load_profiles(), work / "decision_tree")
    figures = {"evidence_runs": {b: str(r) for b, r in evidence_runs.items()},
               "check_runs": {b: str(r) for b, r in check_runs.items()}, "categories": categories,
               "batch_sizes": list(BATCH_SIZES), "max_new_tokens": args.max_new_tokens, "workloads": workloads,
               "learned": learned.as_json()}
    write_json(args.out / "recommend.json", figures)
    lines = ["# Recommend benchmark", "",
             f"`python scripts/bench_recommend.py --categories {','.join(categories)} --max-new-tokens "
             f"{args.max_new_tokens}" + (f" --per-half {args.per_half}" if args.per_half else "")
             + (f" --model {args.model}" if args.model else "")
             + f"` (CPU, greedy, {args.model or 'embedded default model'}; recommend answers from the evidence "
             "half of each category's prompts, the check half measures the winner)", "",
             "| category | batch | recommended (source) | expected | on check | fastest on check | same | loss | "
             "prior | prior on check |", "|---|---|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        expected = f"{w['expected_speedup']:.2f}x" if w["expected_speedup"] is not None else "-"
        on_check = f"{w['check_speedup']:.2f}x" if w["check_speedup"] is not None else "-"
        prior_check = f"{w['prior_check_speedup']:.2f}x" if w["prior_check_speedup"] is not None else "not run"
        lines.append(f"| {w['category']} | {w['batch_size']} | {w['recommended']} ({w['source']}) | {expected} | "
                     f"{on_check} | {w['fastest_on_check']} {w['fastest_speedup']:.2f}x | "
                     f"{'yes' if w['same'] else 'no'} | {w['loss']:.2f} | {w['prior']} | {prior_check} |")
    lines += ["", "Loss: the recommendation's speedup on the check prompts over the fastest strategy's (1.00 when "
              "it is the fastest).", ""]
    lines += [f"- {w['category']}: the measured winner {w['fastest_on_check']} contradicts the prior's "
              f"{w['prior']}" for w in workloads if w["prior_contradicted"]]
    lines += ["", f"Learned tree over both runs: {learned.reason}."]
    write_atomic(args.out / "recommend.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
