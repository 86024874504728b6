"""Foundation benchmarks (issue 2) on the embedded default model, CPU, greedy.

(a) our `draft` against transformers' generate(assistant_model=...) with the same draft model, K
    and prompts: tokens/s ratio;
(b) our `ngram` against transformers' prompt_lookup_num_tokens: tokens/s ratio;
(c) the share of an `ar` step spent outside the model forward;
(d) the speedup of `draft` and `ngram` over `ar` per category (a regular `specbench run`).

Each pair runs interleaved, prompt by prompt, in one process after a warm-up; outputs are
checked to be identical. Writes results/benchmarks/foundation.{json,md}.

    python scripts/bench_foundation.py --limit 24 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from specbench.benchmark.pipeline import run_benchmark
from specbench.benchmark.prepare import prepare
from specbench.config import RunConfig
from specbench.engine.decode import generate
from specbench.files import write_atomic, write_json
from specbench.measure.stats import geometric_mean_ci
from specbench.models import encode_turns
from specbench.output.comparison import comparison, render
from specbench.strategies.names import BASELINE
from specbench.strategies.registry import definition

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def built(bench, name: str):
    """The run's own strategy of that name, as prepared."""
    return next(s for s in bench.strategies if s.name == name)


def hf_versus_ours(bench, strategy_name: str, hf_kwargs: dict, prompts: list[list[int]], max_new: int) -> dict:
    """Tokens/s of our strategy and of transformers' equivalent on the same prompts, interleaved."""
    target = bench.target
    ours = built(bench, strategy_name)
    ratios, ours_tok, ours_s, hf_tok, hf_s, same = [], 0, 0.0, 0, 0.0, 0
    # target forwards: equal counts show equal drafting. Ours are the engine's own count (its fast path
    # does not go through the module, so a forward hook sees only transformers' calls): the prefill, then
    # one verify forward a step
    forwards = {"ours": 0, "transformers": 0}

    def count(*_) -> None:
        forwards["transformers"] += 1

    hook = target.model.register_forward_hook(count)
    for i, prompt in enumerate([prompts[0]] + prompts):  # the first pass is a warm-up
        gen, t_ours = timed(lambda: generate(target.model, prompt, max_new, bench.sampling, target.eos_ids,
                                             ours.drafter, ours.new_controller()))
        ids = torch.tensor([prompt], device=target.device)
        out, t_hf = timed(lambda: target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                        max_new_tokens=max_new, **hf_kwargs))
        hf_tokens = out[0, len(prompt):].tolist()
        if i == 0:
            forwards["transformers"] = 0
            continue
        forwards["ours"] += 1 + gen.steps
        same += hf_tokens == gen.tokens
        ours_tok, ours_s = ours_tok + len(gen.tokens), ours_s + t_ours
        hf_tok, hf_s = hf_tok + len(hf_tokens), hf_s + t_hf
        ratios.append((len(gen.tokens) / t_ours) / (len(hf_tokens) / t_hf))
    hook.remove()
    centre, low, high = geometric_mean_ci(np.array(ratios))
    return {"ours_tokens_per_s": ours_tok / ours_s, "hf_tokens_per_s": hf_tok / hf_s,
            "ratio": (ours_tok / ours_s) / (hf_tok / hf_s), "per_prompt_ratio_geomean": centre,
            "per_prompt_ratio_ci": [low, high], "identical_outputs": f"{same}/{len(ratios)}",
            "target_forwards": forwards}


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
                       max_new_tokens=args.max_new_tokens, device="cpu", out=str(out.parent))
    bench = prepare(config)
    prompts = [encode_turns(bench.target.tokenizer, list(item.turns[:1]), []) for item in bench.suite.items]
    draft_k = definition("draft").options().k
    ngram = definition("ngram").options()
    draft_model = built(bench, "draft").drafter.model
    # transformers reads the draft length from the assistant's own generation config (arguments to
    # generate() are ignored for it): exactly k tokens a round, no confidence-based early stop
    draft_model.generation_config.num_assistant_tokens = draft_k
    draft_model.generation_config.num_assistant_tokens_schedule = "constant"
    draft_model.generation_config.assistant_confidence_threshold = 0.0
    result = {
        "a_draft_vs_transformers": hf_versus_ours(bench, "draft", {"assistant_model": draft_model},
                                                  prompts, args.max_new_tokens),
        "b_ngram_vs_transformers": hf_versus_ours(
            bench, "ngram", {"prompt_lookup_num_tokens": ngram.num_pred_tokens,
                             "max_matching_ngram_size": ngram.max_ngram},
            prompts, args.max_new_tokens),
    }
    report = run_benchmark(config)
    ar = next(r for r in report.summary if r.strategy == BASELINE)
    shares = ar.time_shares
    result["c_ar_outside_forward_share"] = shares["other"] / (shares["verify"] + shares["other"])
    by_category = comparison([report], by="category")
    result["d_speedup_by_category"] = by_category[["strategy", "category", "speedup", "tau"]].to_dict("records")
    result["run_dir"] = str(report.path)
    result["summary"] = [{k: getattr(r, k) for k in ("strategy", "tokens_per_s", "speedup", "speedup_ci", "tau",
                                                     "mismatches")}
                         for r in report.summary]
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
