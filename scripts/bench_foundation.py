"""Foundation benchmarks (issue 2) on the embedded default model, CPU, greedy.

(a) our `draft` against transformers' generate(assistant_model=...) with the same draft model, K
    and prompts: tokens/s ratio;
(b) our `ngram` against transformers' prompt_lookup_num_tokens: tokens/s ratio;
(c) the share of an `ar` step spent outside the model forward;
(d) the speedup of `draft` and `ngram` over `ar` per category (a regular `specbench run`).

(a) and (b) are one `specbench run --engine specbench,transformers`: transformers' generate is an
engine of the run (specbench/engines/transformers.py), so both engines decode each prompt
interleaved, after a warm-up, and every output is checked. Writes results/benchmarks/foundation.{json,md}.

    python scripts/bench_foundation.py --limit 24 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from specbench.analysis.stats import PAIR, geometric_mean_ci
from specbench.bench.pipeline import run_benchmark
from specbench.core.engine_names import SPECBENCH
from specbench.core.files import write_atomic, write_json
from specbench.core.records import RunResult
from specbench.engines.transformers import TRANSFORMERS
from specbench.methods.names import BASELINE
from specbench.plan.run_config import RunConfig
from specbench.report.comparison import comparison, render

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"


def versus_transformers(report: RunResult, strategy: str) -> dict:
    """Tokens/s of our strategy and of transformers' generate running the same method on the same prompts."""
    rows = report.frame()
    rows = rows[rows.strategy == strategy]
    ours, theirs = (rows[rows.engine == engine].set_index(PAIR) for engine in (SPECBENCH, TRANSFORMERS))
    theirs = theirs.loc[ours.index]
    ratios = (ours.new_tokens / ours.wall_s) / (theirs.new_tokens / theirs.wall_s)
    centre, low, high = geometric_mean_ci(np.array(ratios))
    same = sum(a == b for a, b in zip(ours.output_ids, theirs.output_ids))
    ours_rate, hf_rate = (part.new_tokens.sum() / part.wall_s.sum() for part in (ours, theirs))
    # target forwards that committed tokens: equal counts show equal drafting
    return {"ours_tokens_per_s": ours_rate, "hf_tokens_per_s": hf_rate, "ratio": ours_rate / hf_rate,
            "per_prompt_ratio_geomean": centre, "per_prompt_ratio_ci": [low, high],
            "identical_outputs": f"{same}/{len(ours)}",
            "target_forwards": {"ours": int(ours.steps.sum()), "transformers": int(theirs.steps.sum())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--drafter", action="append", default=[], help="repeatable (default: the model's drafters)")
    parser.add_argument("--out", type=Path, default=OUT, help="figures go here, runs to its parent")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    config = RunConfig(model=args.model, drafters=args.drafter, strategies=["ngram", "draft"], limit=args.limit,
                       max_new_tokens=args.max_new_tokens, device="cpu", out=str(out.parent),
                       engine=f"{SPECBENCH},{TRANSFORMERS}")
    report = run_benchmark(config.plan())
    result = {"a_draft_vs_transformers": versus_transformers(report, "draft"),
              "b_ngram_vs_transformers": versus_transformers(report, "ngram")}
    ar = next(r for r in report.summary if r.strategy == BASELINE and r.engine == SPECBENCH)
    shares = ar.time_shares
    result["c_ar_outside_forward_share"] = shares["other"] / (shares["verify"] + shares["other"])
    by_category = comparison([report], by="category")
    by_category = by_category[by_category.engine == SPECBENCH]
    result["d_speedup_by_category"] = by_category[["strategy", "category", "speedup", "tau"]].to_dict("records")
    result["run_dir"] = str(report.path)
    result["summary"] = [{k: getattr(r, k) for k in ("strategy", "tokens_per_s", "speedup", "speedup_ci", "tau",
                                                     "mismatches")}
                         for r in report.summary if r.engine == SPECBENCH]
    write_json(out / "foundation.json", result)
    md = ["# Foundation benchmarks", "", f"`python scripts/bench_foundation.py --limit {args.limit} "
          f"--max-new-tokens {args.max_new_tokens}` (CPU, greedy, embedded default model)", ""]
    for key in ("a_draft_vs_transformers", "b_ngram_vs_transformers"):
        r = result[key]
        md.append(f"- {key}: ours {r['ours_tokens_per_s']:.1f} tok/s, transformers {r['hf_tokens_per_s']:.1f} tok/s, "
                  f"ratio {r['ratio']:.2f} (per-prompt geomean {r['per_prompt_ratio_geomean']:.2f}, 95% CI "
                  f"{r['per_prompt_ratio_ci'][0]:.2f}-{r['per_prompt_ratio_ci'][1]:.2f}); identical outputs "
                  f"{r['identical_outputs']}; target forwards {r['target_forwards']['ours']} vs "
                  f"{r['target_forwards']['transformers']}")
    md.append(f"- c: time outside the model forward in an `ar` step: {100 * result['c_ar_outside_forward_share']:.1f}%")
    md += ["", "## d: speedup over ar per category", "", render(by_category, "markdown"),
           "## Run summary", "", render(comparison([report]), "markdown")]
    write_atomic(out / "foundation.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
