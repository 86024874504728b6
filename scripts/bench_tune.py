"""Tune benchmark on the embedded default model, CPU, greedy: is TPE worth it, and does tuning pay?

1. An enumerable dspark space (window_size x adjust_interval x (k_min, k_max), 63 points, the other
   knobs at their defaults, the scheduler as controller). Every point is measured once on the
   tuning prompts, paired with `ar` (re-measured every few points, as in a study); from the same
   rows come its measured speedup and its shape's projected speedup on a GPU profile. The grid's
   best is the maximum of each table.
2. TPE, as `specbench tune` configures it (the defaults enqueued first), given 25% of the grid's
   points, over 3 seeds, reading the same tables: the comparison is exact, not a comparison of
   noise. The measured runs also report per-prompt values to the WilcoxonPruner, to count the prompt
   runs pruning skips.
   A grid measured once per point is noisy (configurations that are the same in effect, k_min =
   k_max, differ by several percent), so the table's maximum is the luckiest of 63 draws. The grid's
   best and each seed's TPE best are therefore measured again head to head (`--rounds` rounds over
   the tuning prompts, `ar` re-measured on each prompt every round, the configurations in a shuffled
   order): TPE's best over the grid's best per prompt, with its interval, next to the in-table ratio.
3. A real `specbench tune` study of dspark's full space on the same prompts: the tuned configuration
   against the defaults on the held-out prompts (paired speedup and interval), wall time per trial,
   and what pruning saved there.

Writes results/benchmarks/tune.{json,md}.

    python scripts/bench_tune.py --limit 16 --max-new-tokens 64 --study-trials 20 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd

from specbench.analysis.projection import project, workload_shape
from specbench.analysis.stats import geometric_mean
from specbench.bench.prepare import prepare
from specbench.core.files import write_atomic, write_json
from specbench.methods.names import parse_strategy
from specbench.methods.registry import definition
from specbench.methods.search_space import Choice, IntRange, Param, Ref, SearchSpace
from specbench.plan.run_config import RunConfig
from specbench.tuning.holdout import paired_gain, split_items
from specbench.tuning.objective import AR_REFRESH_TRIALS, Evaluator
from specbench.tuning.study import make_pruner, make_sampler
from specbench.tuning.study_config import TuneConfig
from specbench.tuning.study_runner import tune

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
GRID = SearchSpace((
    Param("window_size", Choice((32, 64, 128))),
    Param("adjust_interval", Choice((8, 16, 32))),
    Param("k_min", IntRange(2, 4, step=2)),
    Param("k_max", IntRange(Ref("k_min"), 8, step=2)),
))


def grid_points(space: SearchSpace) -> list[dict]:
    """Every point of a space of choices and stepped integer ranges (bounds may name earlier parameters)."""
    points: list[dict] = [{}]
    for p in space.params:
        grown = []
        for point in points:
            d = p.domain
            if isinstance(d, Choice):
                values = list(d.values)
            else:
                low = d.low if not isinstance(d.low, Ref) else point[d.low.name] + d.low.plus
                values = list(range(int(low), int(d.high) + 1, d.step))
            grown += [{**point, p.name: v} for v in values]
        points = grown
    return points


def key(point: dict) -> tuple:
    return tuple(point[name] for name in GRID.names)


def measure_grid(evaluator: Evaluator, profile) -> dict[tuple, dict]:
    """Each grid point once on every tuning prompt: per-prompt measured and projected speedups."""
    spec = parse_strategy("dspark")
    table = {}
    for i, point in enumerate(grid_points(GRID)):
        strategy = evaluator.build(spec, {"dspark": point}, "dspark")
        measured, projected, started = {}, {}, time.perf_counter()
        for unit in evaluator.units:
            if evaluator.trials - unit.ar_age >= AR_REFRESH_TRIALS:
                evaluator.measure_ar(unit)
            row = evaluator.run(strategy, unit)
            measured[unit.id] = evaluator.value(strategy, unit, row)
            shape = workload_shape(evaluator.bench.target.model, strategy.drafter, pd.DataFrame([row]))
            projected[unit.id] = project(shape, profile)["speedup"]
        evaluator.trials += 1
        table[key(point)] = {"point": point, "measured": measured, "projected": projected,
                             "wall_s": time.perf_counter() - started}
        print(f"grid {i + 1}: {point} measured {geo(measured):.3f} projected {geo(projected):.3f}", flush=True)
    return table


def same_in_effect(table: dict) -> dict:
    """The measured spread of points that differ only in knobs that cannot act (k_min = k_max)."""
    spreads = {}
    for k in sorted({p["point"]["k_min"] for p in table.values() if p["point"]["k_min"] == p["point"]["k_max"]}):
        values = [geo(v["measured"]) for v in table.values() if v["point"]["k_min"] == v["point"]["k_max"] == k]
        spreads[f"k={k}"] = {"points": len(values), "min": min(values), "max": max(values)}
    return spreads


def head_to_head(evaluator: Evaluator, points: list[dict], rounds: int) -> dict[tuple, dict[str, list[float]]]:
    """Per point and prompt, the measured speedups of `rounds` interleaved rounds (ar fresh each round)."""
    spec = parse_strategy("dspark")
    strategies = {key(p): evaluator.build(spec, {"dspark": p}, "dspark") for p in points}
    values: dict[tuple, dict[str, list[float]]] = {k: {u.id: [] for u in evaluator.units} for k in strategies}
    order = random.Random(0)
    for _ in range(rounds):
        for unit in evaluator.units:
            evaluator.measure_ar(unit)
            for k in order.sample(list(strategies), len(strategies)):
                values[k][unit.id].append(evaluator.value(strategies[k], unit, evaluator.run(strategies[k], unit)))
    return values


def remeasured_ratio(values: dict[tuple, dict[str, list[float]]], found: tuple, best: tuple) -> dict:
    """TPE's point over the grid's best, per prompt (geometric means over rounds), with a 95% interval."""
    per_prompt = {k: {u: geometric_mean(v) for u, v in values[k].items()} for k in (found, best)}
    gain = paired_gain(per_prompt[found], per_prompt[best], 0)
    return {"ratio": gain.gain, "ci": gain.gain_ci}


def geo(values: dict) -> float:
    return geometric_mean(list(values.values()))


def tpe_run(table: dict, objective: str, seed: int, trials: int, prune: bool) -> dict:
    """TPE as tune sets it up (defaults first), reading the table; with `prune`, per-prompt reports."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(seed, trials),
                                pruner=make_pruner(("maximize",)) if prune else optuna.pruners.NopPruner())
    defaults = definition("dspark").options()
    study.enqueue_trial({name: getattr(defaults, name) for name in GRID.names})
    prompts = list(next(iter(table.values()))[objective])
    skipped = [0]

    def run(trial: optuna.Trial) -> float:
        values = table[key(GRID.suggest(trial))][objective]
        order = list(prompts)
        random.Random(f"{seed}/{trial.number}").shuffle(order)
        seen = {}
        for p in order:
            seen[p] = values[p]
            if prune:
                trial.report(values[p], prompts.index(p))
                if len(seen) < len(prompts) and trial.should_prune():
                    skipped[0] += len(prompts) - len(seen)
                    raise optuna.TrialPruned()
        return geo(seen)

    study.optimize(run, n_trials=trials)
    best = study.best_trial
    return {"seed": seed, "best_value": best.value, "best_params": best.params,
            "distinct_points": len({tuple(t.params.values()) for t in study.trials}),
            "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
            "prompt_runs_skipped": skipped[0], "prompt_runs": trials * len(prompts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gpu", default="rtx4090", help="profile of the projected objective")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--study-trials", type=int, default=20, help="trials of the real study (part 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the head-to-head re-measurement")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--drafter", default=None, help="its dspark drafter (default: the model's)")
    args = parser.parse_args()
    started = time.perf_counter()
    workload = RunConfig(model=args.model, drafters=[args.drafter] if args.drafter else [], strategies=["dspark"],
                         limit=args.limit, max_new_tokens=args.max_new_tokens, device="cpu", gpu=args.gpu)
    bench = prepare(workload.plan())
    tuning, _ = split_items(bench.suite.items, 0.25, workload.seed)
    evaluator = Evaluator(bench, tuning, None)
    table = measure_grid(evaluator, bench.profile)
    budget = math.ceil(0.25 * len(table))
    parts: dict = {"grid_points": len(table), "tpe_trials": budget, "tuning_prompts": len(evaluator.units)}
    for objective in ("projected", "measured"):
        best_key = max(table, key=lambda k: geo(table[k][objective]))
        grid_best = geo(table[best_key][objective])
        runs = [tpe_run(table, objective, seed, budget, prune=objective == "measured") for seed in range(args.seeds)]
        for r in runs:
            r["of_grid_best"] = r["best_value"] / grid_best
        parts[objective] = {"grid_best": grid_best, "grid_best_point": table[best_key]["point"],
                            "defaults": geo(table[key({n: getattr(definition("dspark").options(), n)
                                                        for n in GRID.names})][objective]),
                            "tpe": runs, "tpe_within_95pct_every_seed": all(r["of_grid_best"] >= 0.95 for r in runs)}
    parts["grid_wall_s_per_point"] = sum(v["wall_s"] for v in table.values()) / len(table)
    measured = parts["measured"]
    measured["same_in_effect"] = same_in_effect(table)
    best = key(measured["grid_best_point"])
    found = {key(r["best_params"]) for r in measured["tpe"]}
    values = head_to_head(evaluator, [table[k]["point"] for k in sorted(found | {best})], args.rounds)
    for r in measured["tpe"]:
        r["remeasured"] = remeasured_ratio(values, key(r["best_params"]), best)
    measured["rounds"] = args.rounds
    measured["tpe_within_95pct_every_seed_remeasured"] = all(r["remeasured"]["ratio"] >= 0.95 for r in measured["tpe"])

    with tempfile.TemporaryDirectory() as tmp:
        config = TuneConfig(workload=dataclasses.replace(workload, gpu=None, out=tmp), strategies=("dspark",),
                            trials=args.study_trials, study="bench-tune-dspark")
        record = tune(config).studies[0]
    saved = record.as_dict()  # the study's record as results/tuned/ holds it
    parts["study"] = {k: saved.get(k) for k in ("best_params", "best_value", "tuning", "holdout", "gain", "defaults",
                                                "trials")} | {"label": record.label}
    parts["command"] = (f"python scripts/bench_tune.py --limit {args.limit} --max-new-tokens {args.max_new_tokens} "
                        f"--gpu {args.gpu} --seeds {args.seeds} --study-trials {args.study_trials} "
                        f"--rounds {args.rounds}")
    parts["wall_s"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "tune.json", parts)
    write_atomic(args.out / "tune.md", markdown(parts))
    print(markdown(parts))


def markdown(p: dict) -> str:
    lines = ["# Tune benchmark", "", f"`{p['command']}` (CPU, greedy, embedded default model; "
             f"{p['tuning_prompts']} tuning prompts; {p['wall_s'] / 60:.1f} min)", "",
             f"## Grid ({p['grid_points']} dspark points) against TPE at {p['tpe_trials']} trials", ""]
    for objective in ("projected", "measured"):
        o = p[objective]
        label = "projected on the GPU profile" if objective == "projected" else "measured on this machine"
        lines += [f"### {objective} ({label})", "",
                  f"- grid best {o['grid_best']:.3f}x at {o['grid_best_point']}; defaults {o['defaults']:.3f}x",
                  "- TPE reaches at least 95% of the grid's best in every seed: "
                  f"**{o['tpe_within_95pct_every_seed']}**",
                  "", "| seed | TPE best | of grid best | distinct points | pruned | prompt runs skipped |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['seed']} | {r['best_value']:.3f}x | {r['of_grid_best']:.1%} | {r['distinct_points']} | "
                  f"{r['pruned']} | {r['prompt_runs_skipped']} of {r['prompt_runs']} |" for r in o["tpe"]]
        lines.append("")
    m = p["measured"]
    spread = "; ".join(f"{k}: {v['points']} points, {v['min']:.3f}x to {v['max']:.3f}x"
                       for k, v in m["same_in_effect"].items())
    lines += ["#### measured again, head to head", "",
              f"Points that are the same in effect (k_min = k_max: the scheduler cannot act) measured "
              f"{spread}, so the table's maximum is partly luck. The grid's best and each seed's TPE best, "
              f"measured again in {m['rounds']} interleaved rounds (ar fresh on every prompt each round):", "",
              "| seed | TPE point | in the table | head to head [95% CI] |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['seed']} | {r['best_params']} | {r['of_grid_best']:.1%} | {r['remeasured']['ratio']:.1%} "
              f"[{r['remeasured']['ci'][0]:.1%}, {r['remeasured']['ci'][1]:.1%}] |" for r in m["tpe"]]
    lines += ["", "- TPE reaches at least 95% of the grid's best in every seed, head to head: "
              f"**{m['tpe_within_95pct_every_seed_remeasured']}**", ""]
    s = p["study"]
    h, t = s["holdout"] or {}, s["trials"]
    tuned, defaults = h.get("tuned") or {}, h.get("defaults") or {}
    gain = (s.get("gain") or {}).get("holdout") or {}
    walls = {k: "n/a" if v is None else f"{v:.1f} s" for k, v in t["wall_s_per_trial"].items()}
    fmt = lambda f, k="speedup": f"{f[k]:.3f}x [{f[k + '_ci'][0]:.3f}, {f[k + '_ci'][1]:.3f}]" if f.get(k) else "n/a"  # noqa: E731
    lines += ["## A real study of dspark's full space", "",
              f"- held out ({tuned.get('prompts', 0)} prompts): tuned {fmt(tuned)}, defaults {fmt(defaults)}, "
              f"gain {fmt(gain, 'gain')}",
              f"- tuning prompts: best {fmt(s['tuning'] or {})}",
              f"- trials: {t['counted']} ({t['complete']} complete, {t['pruned']} pruned); wall per complete trial "
              f"{walls['complete']}, per pruned trial {walls['pruned']}",
              f"- pruning skipped {t['pruning']['prompts_skipped']} of {t['pruning']['prompts_of_pruned_trials']} "
              "prompt runs of the pruned trials",
              f"- grid measurement: {p['grid_wall_s_per_point']:.1f} s per point", "",
              f"best configuration: `{s['best_params']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
