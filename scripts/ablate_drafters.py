"""What the recipe's parts buy an EAGLE drafter of a known model: each variant below is trained for the
same steps from the corpus specbench ships for the model (its hidden states are the ones `prepare --rebuild`
saved) and decoded on held-out corpus prompts and on unseen suite prompts, with the drafting shape shipped
for the model. Speedups come from timed runs of each variant against `ar`, one run each:

    python scripts/ablate_drafters.py smollm2-135m --steps 300
    specbench run --model smollm2-135m --strategy eagle --limit 16 --json \\
        --drafter <out>/<variant> --set eagle.depth=4 ...     # the shape the script prints

Each variant trains in its own directory and resumes there when the script is run again; finished ones
are evaluated, not trained again.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from specbench.core.files import read_json, write_json
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
from specbench.training.trainer import bf16_native, train

STRATEGY = "eagle"
RECIPE = BuildSettings()
# name: (what it changes, training knobs over the recipe's, share of the training sequences)
VARIANTS = {
    "recipe": ("the recipe: 8,192-token draft vocabulary, all data, training-time test", {}, 1.0),
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
    sequences = None
    for name in args.only or VARIANTS:
        what, knobs, share = VARIANTS[name]
        options = make_options(STRATEGY, {**RECIPE.knobs(STRATEGY), **knobs})
        drafter_dir = out / name
        seconds = record.get(name, {}).get("train_seconds")
        if not (drafter_dir / "config.json").is_file():
            model = definition(STRATEGY).trainable(target, options)
            if sequences is None:  # every variant reads the same layers
                sequences = features(target, training, tuple(model.hidden_layers), known.home / "build",
                                     RECIPE.decode_batch, mark, lambda done, total: None)
            chosen = random.Random(RECIPE.seed).sample(sequences, round(len(sequences) * share))
            started = time.time()
            train(model, chosen, drafter_dir, STRATEGY, mark,
                  args.steps, RECIPE.batch_size, RECIPE.lr, RECIPE.max_len, RECIPE.seed, decay=True,
                  on_step=lambda step, loss: step % 50 or print(f"{name} step {step} loss {loss:.3f}", flush=True),
                  bf16=bf16_native(target.device))
            seconds = round(time.time() - started)
        drafting = make_options(STRATEGY, shape)
        entry = {"what": what, "knobs": knobs, "sequences": round(len(training) * share), "steps": args.steps,
                 "train_seconds": seconds}
        for split_name, prompts in (("corpus", evaluation[:RECIPE.held_out]), ("suite", suite)):
            result = held_out(target, STRATEGY, drafting, drafter_dir, prompts, RECIPE.held_out_tokens)
            entry[split_name] = {"tau": round(result.tau, 3), "acceptance": [round(a, 3) for a in result.acceptance]}
            print(name, split_name, result.line(), flush=True)
        record[name] = entry
        write_json(record_path, record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
