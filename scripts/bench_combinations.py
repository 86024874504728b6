"""Combinations against their best member (issue 48), per category, in each way of combining; CPU, greedy.

1. For each `combine.mode` (union, budget, route) one `specbench run` of `ar`, every member and every
   combination (those `--strategy all` runs, unless --combinations) with `--set combine.mode=MODE`.
   Per combination, category and mode: its speedup over `ar`; its best member's there (the member
   with the highest speedup in that category, in the same run) with that member's 95% interval;
   their ratio; tau; the mean verify size (positions a target forward); the draft share of the step;
   and whether the combination's point lies above the best member's interval.
2. What deciding costs: each combination decoded in process (route mode) on the first prompts of
   the suite, the time its score calibration, budget cut, routing and learning take as a share of
   the decoding's wall time (the issue's target: at most 3%).

Writes OUT/combinations-MODEL.{json,md}.

    python scripts/bench_combinations.py --limit 0                                 # the embedded default
    python scripts/bench_combinations.py --model smollm2-135m --limit 0
    python scripts/bench_combinations.py --model smollm2-135m --dataset sharegpt --limit 16   # held out
    python scripts/bench_combinations.py --limit 1 --max-new-tokens 8 --modes route --out /tmp/combinations-smoke
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from specbench.bench.decode_groups import collection_paused
from specbench.bench.pipeline import run_benchmark
from specbench.core.files import write_atomic, write_json
from specbench.core.markdown import markdown_table
from specbench.decoding.decode import generate
from specbench.decoding.target import encode_turn, load_target
from specbench.methods.build import build_strategy
from specbench.methods.combine import CombinedDrafter
from specbench.methods.combine_options import COMBINE, MODES
from specbench.methods.names import COMBINATIONS, parse_strategy
from specbench.plan.run_config import RunConfig, prompt_suite
from specbench.plan.suites import select
from specbench.report.comparison import comparison

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
ALL = "all"  # the category row over every prompt
# CombinedDrafter's deciding, apart from its members' drafting
DECIDING = ("_free", "_pays", "_explore_floor", "_cut", "_learn", "_time_step")


def figures(report) -> pd.DataFrame:
    """Per strategy and category (and ALL): speedup with its interval, tau, verify size, draft share."""
    rows = report.frame()
    parts = []
    for summary, frame in ((comparison([report], by="category"), rows),
                           (comparison([report]).assign(category=ALL), rows.assign(category=ALL))):
        sums = frame.groupby(["strategy", "category"])[["verified", "steps", "draft_s", "wall_s"]].sum()
        sums["verify_size"] = sums.verified / sums.steps
        sums["draft_share"] = sums.draft_s / sums.wall_s
        parts.append(summary.merge(sums[["verify_size", "draft_share"]].reset_index(), on=["strategy", "category"]))
    return pd.concat(parts)[["strategy", "category", "speedup", "speedup_ci_low", "speedup_ci_high", "tau",
                             "verify_size", "draft_share", "mismatches"]]


def against_best_member(table: pd.DataFrame, combos: list[str], mode: str) -> list[dict]:
    out = []
    for combo in combos:
        members = parse_strategy(combo).members
        for category, part in table.groupby("category"):
            by = part.set_index("strategy")
            if combo not in by.index or not set(members) <= set(by.index):
                continue
            best = max(members, key=lambda m: by.loc[m, "speedup"])
            c, b = by.loc[combo], by.loc[best]
            out.append({"mode": mode, "combination": combo, "category": category, "speedup": c.speedup,
                        "best_member": best, "best_speedup": b.speedup,
                        "best_ci": [b.speedup_ci_low, b.speedup_ci_high], "ratio": c.speedup / b.speedup,
                        "above_best_interval": bool(c.speedup > b.speedup_ci_high), "tau": c.tau,
                        "best_tau": b.tau, "verify_size": c.verify_size, "best_verify_size": b.verify_size,
                        "draft_share": c.draft_share, "best_draft_share": b.draft_share,
                        "mismatches": c.mismatches})
    return out


class Timed:
    """Wraps CombinedDrafter's deciding methods on one drafter, adding their wall time up."""

    def __init__(self, drafter: CombinedDrafter):
        self.seconds = 0.0
        for name in DECIDING:
            setattr(drafter, name, self.wrap(getattr(drafter, name)))

    def wrap(self, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def deciding_share(config: RunConfig, combos: list[str], prompts: int) -> list[dict]:
    """Per combination: the deciding's share of the wall time of decoding the run's first `prompts` prompts
    in route mode."""
    target = load_target(config.model, torch.device("cpu"), torch.float32)
    max_new_tokens = config.max_new_tokens
    items = select(prompt_suite(config, prompts), limit=prompts).items
    encoded = [encode_turn(target.tokenizer, item) for item in items]
    out = []
    for combo in combos:
        strategy = build_strategy(parse_strategy(combo), target, {COMBINE: {"mode": "route"}}, {})
        timer = Timed(strategy.drafter)
        with collection_paused():  # as the runs decode
            wall = sum(generate(target.model, ids, max_new_tokens, eos_ids=target.eos_ids, drafter=strategy.drafter,
                                controller=strategy.new_controller()).wall_s for ids in encoded)
        out.append({"combination": combo, "deciding_s": timer.seconds, "wall_s": wall,
                    "share": timer.seconds / wall if wall else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--drafter", action="append", default=[], help="repeatable (default: the model's drafters)")
    parser.add_argument("--limit", type=int, default=0, help="prompts (0: the whole suite)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--suite", default="default")
    parser.add_argument("--dataset", default=None, help="prompts from ShareGPT's conversations instead (run --dataset)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--combinations", default=",".join(COMBINATIONS))
    parser.add_argument("--decide-prompts", type=int, default=8, help="prompts the deciding cost is timed on")
    parser.add_argument("--out", type=Path, default=OUT, help="figures go here, runs to its parent")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    combos = [parse_strategy(c).name for c in args.combinations.split(",")]
    members = sorted({m for c in combos for m in parse_strategy(c).members})
    rows, runs = [], {}
    for mode in args.modes.split(","):
        config = RunConfig(model=args.model, drafters=args.drafter, strategies=members + combos, limit=args.limit,
                           max_new_tokens=args.max_new_tokens, suite=args.suite, dataset=args.dataset, device="cpu",
                           out=str(args.out.parent), knobs={COMBINE: {"mode": mode}})
        report = run_benchmark(config.plan())
        runs[mode] = str(report.path)
        rows += against_best_member(figures(report), combos, mode)
    deciding = deciding_share(config, combos, args.decide_prompts)
    name = (args.model or "default") + (f"-{Path(args.dataset).stem}" if args.dataset else "")
    write_json(args.out / f"combinations-{name}.json", {"runs": runs, "against_best_member": rows,
                                                         "deciding": deciding})
    command = (f"python scripts/bench_combinations.py{f' --model {args.model}' if args.model else ''} "
               + (f"--dataset {args.dataset} " if args.dataset else "")
               + f"--limit {args.limit} --max-new-tokens {args.max_new_tokens}"
               + (f" --modes {args.modes}" if args.modes != ",".join(MODES) else "")
               + (f" --decide-prompts {args.decide_prompts}" if args.decide_prompts != 8 else ""))
    table = [[r["mode"], r["combination"], r["category"], f"{r['speedup']:.2f}x",
              f"{r['best_member']} {r['best_speedup']:.2f}x ({r['best_ci'][0]:.2f}-{r['best_ci'][1]:.2f})",
              f"{r['ratio']:.2f}" + (" above" if r["above_best_interval"] else ""),
              f"{r['tau']:.2f} / {r['best_tau']:.2f}", f"{r['verify_size']:.1f} / {r['best_verify_size']:.1f}",
              f"{r['draft_share']:.0%} / {r['best_draft_share']:.0%}", str(r["mismatches"])]
             for r in rows]
    md = [f"# Combinations against their best member: {name}", "", f"`{command}` (CPU, greedy)", "",
          "ratio: the combination's speedup over its best member's in the same run and category (`above`: "
          "its point lies above that member's 95% interval); tau, verify size (positions a target forward) "
          "and draft share of the step: the combination's / its best member's.", "",
          markdown_table(["mode", "combination", "category", "speedup", "best member (95% CI)", "ratio",
                          "tau", "verify size", "draft share", "mismatches"], table), "",
          "## What deciding costs (route mode)", "",
          markdown_table(["combination", "deciding s", "wall s", "share of the step"],
                         [[d["combination"], f"{d['deciding_s']:.3f}", f"{d['wall_s']:.2f}",
                           f"{d['share']:.1%}" if d["share"] is not None else "-"] for d in deciding])]
    write_atomic(args.out / f"combinations-{name}.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
