"""What the recipe's parts buy an EAGLE drafter of a known model: each variant below is trained for the
same steps from the corpus specbench ships for the model (its hidden states are the ones `prepare --rebuild`
saved), decoded on held-out corpus prompts and on unseen suite prompts with the drafting shape shipped for
the model, then (`--time`, on a quiet machine) timed against `ar` in a run of its own:

    python scripts/ablate_drafters.py smollm2-135m --steps 300                  # train and decode
    python scripts/ablate_drafters.py smollm2-135m --steps 300 --time \
        --also shipped=~/.cache/specbench/models/smollm2-135m/drafters/eagle \
        --report results/benchmarks/smollm2-ablation                            # time, write the table

`--also NAME=DIR` adds a finished drafter (one built with more steps or other data) as a row. Each variant
trains in its own directory and resumes there when the script runs again; finished ones are not trained
again, and figures already in the record are not measured again.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from specbench.core.files import read_json, write_atomic, write_json
from specbench.decoding.linear import bf16_native
from specbench.decoding.model_source import preparable
from specbench.decoding.target import encode_turn, fingerprint, load_target
from specbench.methods.base import DRAFTING
from specbench.methods.knobs import make_options
from specbench.methods.registry import definition
from specbench.plan.suites import load_suite, select
from specbench.training.build_drafters import BuildSettings
from specbench.training.corpus import build_corpus
from specbench.training.distill import features, split
from specbench.training.held_out import held_out
from specbench.training.trainer import train

STRATEGY = "eagle"
RECIPE = BuildSettings()
# name: (what it changes, training knobs over the recipe's, share of the training sequences)
VARIANTS = {
    "recipe": ("8,192-token draft vocabulary, all data, training-time test", {}, 1.0),
    "full-vocab": ("the target's whole 49,152-token vocabulary", {"draft_vocab": 0}, 1.0),
    "small-data": ("a sixteenth of the data (about the 192 answers of the first build)", {}, 1 / 16),
    "no-ttt": ("no training-time test (one step, as EAGLE-1)", {"ttt_steps": 1}, 1.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, help="where the variants train (default: the model's home/ablation)")
    parser.add_argument("--only", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--suite", default="specbench")
    parser.add_argument("--limit", type=int, default=16, help="suite prompts decoded")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                        help="a finished drafter measured beside the variants")
    parser.add_argument("--time", action="store_true", help="time each against `ar` (a quiet machine)")
    parser.add_argument("--report", type=Path, help="write the table to REPORT.md and the figures to REPORT.json")
    args = parser.parse_args()
    known = preparable(args.model)
    out = args.out or known.home / "ablation"
    target = load_target(args.model, torch.device("cpu"), torch.float32)
    mark = fingerprint(target.model)
    corpus = build_corpus(target, known.home / "build", RECIPE.corpus, mark, lambda done, total: None,
                          known.shipped_corpus)
    training, evaluation = split(corpus)
    suite = [encode_turn(target.tokenizer, item) for item in select(load_suite(args.suite), None, args.limit).items]
    shape = read_json(known.shipped / "drafters" / STRATEGY / "config.json", "drafter config").get(DRAFTING, {})
    print("drafting shape:", " ".join(f"--set {STRATEGY}.{k}={v}" for k, v in shape.items()), flush=True)
    record_path = out / "ablation.json"
    record = read_json(record_path, "ablation record") if record_path.is_file() else {}
    given = dict(item.split("=", 1) for item in args.also)
    sequences = None
    for name in [*(args.only or VARIANTS), *given]:
        what, knobs, share = VARIANTS.get(name, ("", {}, None))
        drafter_dir = Path(given[name]).expanduser() if name in given else out / name
        entry = {**record.get(name, {}), "what": what, "knobs": knobs, "steps": args.steps if share else None}
        if share and not (drafter_dir / "config.json").is_file():
            options = make_options(STRATEGY, {**RECIPE.knobs(STRATEGY), **knobs})
            model = definition(STRATEGY).trainable(target, options)
            if sequences is None:  # every variant reads the same layers
                sequences = features(target, training, tuple(model.hidden_layers), known.home / "build",
                                     RECIPE.decode_batch, mark, lambda done, total: None)
            chosen = random.Random(RECIPE.seed).sample(sequences, round(len(sequences) * share))
            started = time.time()
            train(model, chosen, drafter_dir, STRATEGY, mark, args.steps, RECIPE.batch_size, RECIPE.lr,
                  RECIPE.max_len, RECIPE.seed, decay=True, bf16=bf16_native(target.device),
                  on_step=lambda step, loss: step % 50 or print(f"{name} step {step} loss {loss:.3f}", flush=True))
            entry.update(sequences=len(chosen), train_seconds=round(time.time() - started))
        drafting = make_options(STRATEGY, shape)
        for split_name, prompts in (("corpus", evaluation[:RECIPE.held_out]), ("suite", suite)):
            if split_name not in entry:
                result = held_out(target, STRATEGY, drafting, drafter_dir, prompts, RECIPE.held_out_tokens)
                entry[split_name] = {"tau": round(result.tau, 3),
                                     "acceptance": [round(a, 3) for a in result.acceptance]}
                print(name, split_name, result.line(), flush=True)
        if args.time and "speedup" not in entry:
            entry.update(timed(args.model, drafter_dir, shape, args.limit, out / "runs"))
            print(name, "speedup", entry["speedup"], entry["speedup_ci"], flush=True)
        record[name] = entry
        write_json(record_path, record)
    if args.report:
        write_json(args.report.with_suffix(".json"), record)
        write_atomic(args.report.with_suffix(".md"), table(args.model, record, shape))
    print(json.dumps(record, indent=1))


def timed(model: str, drafter_dir: Path, shape: dict, limit: int, out: Path) -> dict:
    """The drafter against `ar` in a run of its own on the default suite: speedup, its interval, tau."""
    import specbench

    result = specbench.run(model=model, strategies=[STRATEGY], drafters=[str(drafter_dir)], limit=limit,
                           knobs={STRATEGY: shape}, out=str(out))
    row = next(s for s in result.summary if s.strategy == STRATEGY)
    return {"speedup": round(row.speedup, 3), "speedup_ci": [round(c, 3) for c in row.speedup_ci],
            "run_tau": round(row.tau, 3), "mismatches": row.mismatches, "run": str(result.path)}


def table(model: str, record: dict, shape: dict) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in shape.items())
    lines = [f"# What the recipe bought {model}'s EAGLE drafter", "",
             f"`python scripts/ablate_drafters.py {model} --time --report ...`; drafting shape {shown}. Held-out tau",
             f"and first-position acceptance decoded on {RECIPE.held_out} held-out corpus requests and on the suite "
             "prompts; the",
             "speedup over `ar` from a run of each alone (95% bootstrap interval).", "",
             "| drafter | steps | sequences | corpus tau | suite tau | suite p1 | speedup [95% CI] | mismatches |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in record.items():
        speedup = (f"{e['speedup']:.2f}x [{e['speedup_ci'][0]:.2f}, {e['speedup_ci'][1]:.2f}]"
                   if "speedup" in e else "not timed")
        label = f"{name}: {e['what']}" if e["what"] else name
        lines.append(f"| {label} | {e.get('steps') or ''} | {e.get('sequences', '')} | "
                     f"{e['corpus']['tau']:.2f} | {e['suite']['tau']:.2f} | {e['suite']['acceptance'][0]:.2f} | "
                     f"{speedup} | {e.get('mismatches', '')} |")
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    main()
