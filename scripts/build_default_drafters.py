"""Rebuild the drafters of the embedded default model: eagle, mtp, dflash and dspark.

Self-distillation, as EAGLE-3 (arXiv 2503.01840) and DeepSpec make their data: the default target
regenerates its own answers to training prompts of many kinds made from the Python standard
library's functions and docstrings (never the benchmark suite), its hidden states of every layer
are kept once, and each drafter is trained on the layers it reads. Written to
specbench/assets/default/drafters/<strategy> (--out).

    python scripts/build_default_drafters.py                       # all four
    python scripts/build_default_drafters.py --only dflash --steps 400
    python scripts/build_default_drafters.py --model ./my-target --out drafters --corpus-bytes 200000
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from build_default_model import CORPUS_BYTES, instruction_pairs, stdlib_sources  # noqa: E402

from specbench.core.files import write_json  # noqa: E402
from specbench.decoding.target import DEFAULT_DIR, fingerprint, load_target  # noqa: E402
from specbench.methods.registry import definition  # noqa: E402
from specbench.training.distill import collect, pick_layers  # noqa: E402
from specbench.training.trainer import train  # noqa: E402

DRAFTERS = ("eagle", "mtp", "dflash", "dspark")


def training_prompts(count: int, corpus_bytes: int = CORPUS_BYTES) -> list[list[str]]:
    """`count` prompts of many kinds (code, explanation, summary, extraction, translation, arithmetic,
    verse), written here from standard-library material: the drafters learn the target's answers to
    the sort of requests a suite holds without ever seeing a suite."""
    rng = random.Random(1)
    functions, passages = [], []
    for module, source in stdlib_sources(corpus_bytes):
        for pair in instruction_pairs(source):
            functions.append((module, pair.split("<|end|>")[0].removeprefix("<|user|>\n")))
        tree = ast.parse(source) if source.isascii() else None  # ASCII modules: English prose passages
        doc = ast.get_docstring(tree) if tree else None
        if doc and 200 <= len(doc) <= 1200:
            passages.append((module, doc.strip()))

    def prose() -> tuple[str, str]:
        module, doc = rng.choice(passages)
        return module.removesuffix(".py").replace("/", "."), doc

    def sentence() -> str:
        return rng.choice([s.strip() for s in prose()[1].replace("\n", " ").split(". ") if 20 < len(s) < 160]
                          or ["The module reads the configuration file."])

    kinds = [
        lambda: rng.choice(functions)[1],
        lambda: "In two sentences, what is the purpose of the Python module `{}`?".format(prose()[0]),
        lambda: "Give a one-sentence summary of this text.\n\n" + prose()[1],
        lambda: "List every function or class name this text mentions, as a JSON array.\n\n" + prose()[1],
        lambda: 'Translate into {}: "{}"'.format(rng.choice(["Spanish", "Italian", "Dutch", "French"]), sentence()),
        lambda: "What is {} * {} - {}? Explain each step.".format(rng.randint(12, 99), rng.randint(3, 40),
                                                                  rng.randint(1, 500)),
        lambda: "Write four lines of verse about the `{}` module.".format(prose()[0]),
        lambda: "Describe exactly what happens, step by step, when a program imports `{}`.".format(prose()[0]),
    ]
    return [[kinds[i % len(kinds)]()] for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=DRAFTERS, action="append")
    parser.add_argument("--prompts", type=int, default=240)
    parser.add_argument("--answer-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--corpus-bytes", type=int, default=CORPUS_BYTES, help="standard-library source to draw from")
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR / "drafters", help="where <strategy>/ go")
    args = parser.parse_args()
    torch.manual_seed(0)
    target = load_target(args.model, torch.device("cpu"), torch.float32)
    all_layers = tuple(range(target.model.config.num_hidden_layers + 1))
    started = time.time()
    sequences = collect(target, training_prompts(args.prompts, args.corpus_bytes), all_layers, args.answer_tokens)
    print(f"distilled {len(sequences)} answers in {time.time() - started:.0f}s", flush=True)
    record_file = args.out / "BUILD.json"
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    for name in args.only or DRAFTERS:
        method = definition(name)
        torch.manual_seed(0)
        model = method.trainable(target, method.options())
        data = pick_layers(sequences, all_layers, tuple(model.hidden_layers))
        started = time.time()
        losses = train(model, data, args.out / name, name, fingerprint(target.model), args.steps,
                       batch_size=8, lr=1e-3, max_len=192, seed=0,
                       on_step=lambda s, loss: print(f"{name} step {s} loss {loss:.3f}", flush=True)
                       if s % 25 == 0 else None)
        record[name] = {"steps": args.steps, "prompts": args.prompts, "answer_tokens": args.answer_tokens,
                        "first_loss": losses[0], "final_loss": sum(losses[-10:]) / 10,
                        "parameters": sum(p.numel() for p in model.parameters()),
                        "train_seconds": round(time.time() - started)}
        write_json(record_file, record)


if __name__ == "__main__":
    main()
