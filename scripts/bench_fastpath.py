"""The engine's forwards against transformers' forward, in one process: transformers' modules over a
DynamicCache; decoding/flat.py's fast forward with F.linear's products; and the fast forward with
decoding/linear.py's packed weights (oneDNN on a CPU), which is what a run uses.

Each round decodes the same prompts of the default suite with each strategy once per forward, in an
order rotated from round to round; tokens/s per forward are the tokens over the decode wall time summed
over the rounds, and each ratio to transformers' is the median of the per-round ratios (so a busy
machine slows every side of a round alike). The greedy tokens must be identical: the count of prompts
whose tokens differ from transformers' is printed, and any such prompt ends the script with an error.
Prints a table; with --out also writes it as JSON.

    python scripts/bench_fastpath.py --limit 4 --max-new-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specbench.core.files import write_json
from specbench.decoding.decode import generate
from specbench.decoding.kv_cache import fast_path
from specbench.decoding.linear import packing
from specbench.decoding.target import encode_turns, load_target
from specbench.methods.build import build_strategy
from specbench.methods.names import BASELINE, parse_strategy
from specbench.methods.published.formats import drafter_dirs_by_strategy
from specbench.plan.suites import load_suite, select

TRANSFORMERS = "transformers"
FORWARDS = {TRANSFORMERS: (False, False), "flat": (True, False), "packed": (True, True)}  # fast_path, packing
ORDER = list(FORWARDS)
ENGINES = ORDER[1:]  # the engine's own forwards, each against transformers'


def decode_all(target, prompts: list[list[int]], max_new_tokens: int, strategy) -> tuple[list[list[int]], float, int]:
    """Tokens per prompt, decode seconds (prefill included), tokens decoded."""
    outputs, seconds = [], 0.0
    for prompt in prompts:
        controller = strategy.new_controller() if strategy.drafter else None
        gen = generate(target.model, prompt, max_new_tokens, eos_ids=target.eos_ids, drafter=strategy.drafter,
                       controller=controller)
        outputs.append(gen.tokens)
        seconds += gen.wall_s
    return outputs, seconds, sum(len(o) for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strategy", action="append", help="repeatable; default: ar, ngram, draft")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--model", default=None, help="the target (default: the embedded model)")
    parser.add_argument("--drafter", action="append", default=[], help="repeatable (default: the model's drafters)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    target = load_target(args.model, torch.device("cpu"), torch.float32)
    suite = select(load_suite("default"), limit=args.limit)
    prompts = [encode_turns(target.tokenizer, list(item.turns[:1]), []) for item in suite.items]
    names = [parse_strategy(name) for name in args.strategy or [BASELINE, "ngram", "draft"]]
    sources = drafter_dirs_by_strategy(args.drafter, names)
    strategies = {spec.name: build_strategy(spec, target, {}, sources) for spec in names}
    print(f"loaded in {time.perf_counter() - started:.1f} s; {len(prompts)} prompts, {torch.get_num_threads()} threads")
    rows = {}
    for name, strategy in strategies.items():
        seconds, tokens = dict.fromkeys(FORWARDS, 0.0), dict.fromkeys(FORWARDS, 0)
        ratios: dict[str, list[float]] = {forward: [] for forward in ENGINES}
        differing = dict.fromkeys(ENGINES, 0)
        for r in range(args.rounds):
            outputs, speed = {}, {}
            for forward in ORDER[r % len(ORDER):] + ORDER[:r % len(ORDER)]:
                flat, packed = FORWARDS[forward]
                with fast_path(flat), packing(packed):
                    outputs[forward], wall, count = decode_all(target, prompts, args.max_new_tokens, strategy)
                seconds[forward] += wall
                tokens[forward] += count
                speed[forward] = count / wall
            for forward in ENGINES:
                ratios[forward].append(speed[forward] / speed[TRANSFORMERS])
                differing[forward] = max(differing[forward], sum(
                    a != b for a, b in zip(outputs[forward], outputs[TRANSFORMERS], strict=True)))
        rows[name] = {f"{forward}_tokens_per_s": tokens[forward] / seconds[forward] for forward in FORWARDS}
        rows[name] |= {f"{forward}_over_transformers": statistics.median(ratios[forward]) for forward in ENGINES}
        rows[name] |= {"ratios": ratios, "prompts_differing": differing}
        row = rows[name]
        speeds = "  ".join(f"{forward} {row[f'{forward}_tokens_per_s']:.1f}" for forward in FORWARDS)
        over = "  ".join(f"{forward} {row[f'{forward}_over_transformers']:.2f}x" for forward in ENGINES)
        print(f"{name:8s} tok/s: {speeds}   over transformers: {over}   "
              f"prompts differing: {', '.join(str(differing[f]) for f in ENGINES)}")
        if any(differing.values()):
            raise SystemExit(f"{name}: the engine's greedy tokens differ from transformers' "
                             f"({', '.join(f'{f}: {n} prompts' for f, n in differing.items() if n)})")
    if args.out:
        write_json(args.out, {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                              "threads": torch.get_num_threads(), "strategies": rows})


if __name__ == "__main__":
    main()
