"""Drafter benchmarks on the embedded default model, CPU, `ar` in the same run.

One `specbench run --strategy all` over the default suite (every drafter and the listed
combinations, greedy), then the figures: tau on the code category per trained drafter with
per-position acceptance, the fastest of eagle / dflash / dspark with its 95% interval, dspark tau
against dflash tau, eagle+dflash tau against its members, and the cost model's prediction (from
separately timed forwards) beside every measured speedup with measured / predicted. Then the
combinations that pair a tree drafter with a sampling drafter, sampled at temperature 1 and greedy,
with their acceptance figures and the greedy check. Writes results/benchmarks/drafters.{json,md}.

    python scripts/bench_drafters.py --limit 32 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from specbench.bench.pipeline import run_benchmark
from specbench.core.files import write_atomic, write_json
from specbench.methods.names import BASELINE, parse_strategies
from specbench.methods.published.formats import drafters_used_by
from specbench.plan.run_config import RunConfig
from specbench.report.comparison import acceptance_table, comparison, render

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
DRAFTERS = ("eagle", "mtp", "dflash", "dspark")
SAMPLED = ["eagle+dflash", "mtp+dspark"]


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sampled-limit", type=int, default=8, help="prompts of the sampled combinations")
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--drafter", action="append", default=[], help="repeatable (default: the model's drafters)")
    parser.add_argument("--out", type=Path, default=OUT, help="figures go here, runs to its parent")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    workload = RunConfig(model=args.model, drafters=args.drafter, limit=args.limit, max_new_tokens=args.max_new_tokens,
                         device="cpu", out=str(out.parent))
    report = run_benchmark(replace(workload, strategies=["all"]).plan())
    results = {r.strategy: r.as_dict() for r in report.summary}
    code = {s.strategy: s.as_dict() for s in report.by_category if s.category == "code"}
    fastest = max(("eagle", "dflash", "dspark"), key=lambda s: results[s]["speedup"])
    figures = {
        "run_dir": str(report.path),
        "noise": report.noise.as_dict(),
        "tau_code": {s: code[s]["tau"] for s in DRAFTERS},
        "acceptance_rate_by_position": {s: results[s]["acceptance_rate_by_position"] for s in DRAFTERS},
        "fastest_feature_drafter": {"strategy": fastest, "speedup": results[fastest]["speedup"],
                                    "speedup_ci": results[fastest]["speedup_ci"]},
        "dspark_vs_dflash_tau": [results["dspark"]["tau"], results["dflash"]["tau"]],
        "eagle_dflash_tau": {s: results[s]["tau"] for s in ("eagle+dflash", "eagle", "dflash")},
        "measured_vs_predicted": {s: {"speedup": r["speedup"], "tau": r["tau"],
                                      "draft_efficiency": r["draft_efficiency"],
                                      "predicted": (r.get("cost_model") or {}).get("predicted_speedup"),
                                      "measured_over_predicted": (r.get("cost_model") or {}).get(
                                          "measured_over_predicted")}
                                  for s, r in results.items() if s != BASELINE},
        "mismatches": {s: r["mismatches"] for s, r in results.items()},
    }
    sampled = {}
    sampled_drafters = drafters_used_by(args.drafter, parse_strategies(SAMPLED))
    for temperature in (1.0, 0.0):
        run = run_benchmark(replace(workload, strategies=SAMPLED, drafters=sampled_drafters, limit=args.sampled_limit,
                                    temperature=temperature).plan())
        sampled[f"temperature {temperature:g}"] = {
            "run_dir": str(run.path),
            "results": {r.strategy: {k: getattr(r, k) for k in ("speedup", "speedup_ci", "tau",
                                                                "acceptance_rate_by_position", "draft_efficiency",
                                                                "mismatches")}
                        for r in run.summary}}
    figures["sampled_combinations"] = sampled
    write_json(out / "drafters.json", figures)

    runs = [report]
    table = comparison(runs)
    lines = ["# Drafter benchmarks", "",
             f"`python scripts/bench_drafters.py --limit {args.limit} --max-new-tokens {args.max_new_tokens}` "
             "(CPU, float32, greedy, embedded default model and its shipped drafters)", "",
             "## All strategies", "", render(table, "markdown", wide=True),
             acceptance_table(table, "markdown"), "## tau on the code category", ""]
    lines += [f"- {s}: tau {figures['tau_code'][s]:.2f}; per-position acceptance "
              + " ".join(f"{a:.2f}" for a in figures["acceptance_rate_by_position"][s]) for s in DRAFTERS]
    f = figures["fastest_feature_drafter"]
    lines += ["", f"Fastest of eagle, dflash, dspark: {f['strategy']} at {f['speedup']:.2f}x "
              f"(95% CI {f['speedup_ci'][0]:.2f}-{f['speedup_ci'][1]:.2f})",
              "dspark tau {:.2f} vs dflash tau {:.2f}".format(*figures["dspark_vs_dflash_tau"]),
              "eagle+dflash tau {eagle+dflash:.2f} vs eagle {eagle:.2f}, dflash {dflash:.2f}".format(
                  **figures["eagle_dflash_tau"]),
              "", "## Measured speedup beside the cost model", "",
              "Predicted from the run's tau and draft shape and from forwards timed separately "
              "(results/costs/); measured / predicted below 1 is the engine's overhead.", "",
              "| strategy | tau | draft efficiency | speedup | predicted | measured / predicted |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {s} | {m['tau']:.2f} | {fmt(m['draft_efficiency'], '.0%')} | {m['speedup']:.2f} | "
              f"{fmt(m['predicted'])} | {fmt(m['measured_over_predicted'])} |"
              for s, m in figures["measured_vs_predicted"].items()]
    lines += ["", "## Tree drafter + sampling drafter, sampled and greedy (8 prompts)", ""]
    for label, part in sampled.items():
        lines += [f"### {label}", "", "| strategy | speedup | tau | draft efficiency | a_1..a_k | mismatches |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {s} | {r['speedup']:.2f} | {r['tau']:.2f} | {fmt(r['draft_efficiency'], '.0%')} | "
                  + " ".join(f"{a:.2f}" for a in r["acceptance_rate_by_position"][:8])
                  + f" | {'n/a (sampling)' if r['mismatches'] is None else r['mismatches']} |"
                  for s, r in part["results"].items()]
        lines.append("")
    lines += ["## By category", "", render(comparison(runs, by="category"), "markdown")]
    write_atomic(out / "drafters.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
