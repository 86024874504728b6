"""Drafter benchmarks (issue 3) on the embedded default model, CPU, greedy, `ar` in the same run.

One `specbench run` over the default suite with every strategy and the listed combinations, then
the figures the issue asks for: tau on the code category per trained drafter with per-position
acceptance, the fastest of eagle / dflash / dspark with its 95% interval, dspark tau against
dflash tau, eagle+dflash tau against its members, and the cost model's prediction beside every
measured speedup. Writes results/benchmarks/drafters.{json,md}.

    python scripts/bench_drafters.py --limit 32 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbench.bench import run_benchmark
from specbench.config import RunConfig
from specbench.report import comparison, load_runs, render

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
DRAFTERS = ("eagle", "mtp", "dflash", "dspark")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    report = run_benchmark(RunConfig(strategies=["all"], limit=args.limit, max_new_tokens=args.max_new_tokens,
                                     device="cpu", out=str(OUT.parent)))
    results = {r["strategy"]: r for r in report.results}
    runs, _ = load_runs([report.run_dir])
    by_category = comparison(runs, by="category")
    code = by_category[by_category.category == "code"].set_index("strategy")
    fastest = max(("eagle", "dflash", "dspark"), key=lambda s: results[s]["speedup"])
    figures = {
        "run_dir": str(report.run_dir),
        "tau_code": {s: float(code.loc[s, "tau"]) for s in DRAFTERS},
        "per_position_acceptance": {s: results[s]["per_position_acceptance"] for s in DRAFTERS},
        "fastest_feature_drafter": {"strategy": fastest, "speedup": results[fastest]["speedup"],
                                    "speedup_ci": results[fastest]["speedup_ci"]},
        "dspark_vs_dflash_tau": [results["dspark"]["tau"], results["dflash"]["tau"]],
        "eagle_dflash_tau": {s: results[s]["tau"] for s in ("eagle+dflash", "eagle", "dflash")},
        "measured_vs_predicted": {s: {"speedup": r["speedup"],
                                      "predicted": r.get("cost_model", {}).get("predicted_speedup"),
                                      "tau": r["tau"], "predicted_tau": r.get("cost_model", {}).get("predicted_tau")}
                                  for s, r in results.items() if s != "ar"},
        "mismatches": {s: r["mismatches"] for s, r in results.items()},
    }
    (OUT / "drafters.json").write_text(json.dumps(figures, indent=2, default=float) + "\n")
    lines = ["# Drafter benchmarks", "",
             f"`python scripts/bench_drafters.py --limit {args.limit} --max-new-tokens {args.max_new_tokens}` "
             "(CPU, greedy, embedded default model and its shipped drafters)", "",
             "## All strategies", "", render(comparison(runs), "markdown"),
             "## tau on the code category", ""]
    lines += [f"- {s}: tau {figures['tau_code'][s]:.2f}; per-position acceptance "
              + " ".join(f"{a:.2f}" for a in figures["per_position_acceptance"][s]) for s in DRAFTERS]
    f = figures["fastest_feature_drafter"]
    lines += ["", f"Fastest of eagle, dflash, dspark: {f['strategy']} at {f['speedup']:.2f}x "
              f"(95% CI {f['speedup_ci'][0]:.2f}-{f['speedup_ci'][1]:.2f})",
              "dspark tau {:.2f} vs dflash tau {:.2f}".format(*figures["dspark_vs_dflash_tau"]),
              "eagle+dflash tau {eagle+dflash:.2f} vs eagle {eagle:.2f}, dflash {dflash:.2f}".format(
                  **figures["eagle_dflash_tau"]),
              "", "## Measured speedup beside the cost model", "",
              "| strategy | tau | predicted tau | speedup | predicted speedup |",
              "|---|---|---|---|---|"]
    lines += [f"| {s} | {m['tau']:.2f} | {m['predicted_tau'] or float('nan'):.2f} | {m['speedup']:.2f} | "
              f"{m['predicted'] or float('nan'):.2f} |" for s, m in figures["measured_vs_predicted"].items()]
    lines += ["", "## By category", "", render(by_category, "markdown")]
    (OUT / "drafters.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
