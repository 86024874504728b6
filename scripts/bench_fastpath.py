"""The engine's fast forward (engine/flat.py) against transformers' forward, in one process.

Each round decodes the same prompts of the default suite with each strategy twice, once on
transformers' forward over a DynamicCache and once on the fast path, in alternating order; tokens/s
per path are the tokens over the decode wall time summed over the round, and the ratio is the median
of the per-round ratios (so a busy machine slows both sides of a round alike). The greedy tokens of
the two paths must be identical. Prints a table; with --out also writes it as JSON.

    python scripts/bench_fastpath.py --limit 4 --max-new-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specbench.engine.decode import generate
from specbench.engine.kv_cache import fast_path
from specbench.files import write_json
from specbench.models import encode_turns, load_target
from specbench.strategies.build import build_strategy
from specbench.strategies.names import BASELINE, parse_strategy
from specbench.suites import load_suite, select


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    target = load_target(None, torch.device("cpu"), torch.float32)
    suite = select(load_suite("default"), limit=args.limit)
    prompts = [encode_turns(target.tokenizer, list(item.turns[:1]), []) for item in suite.items]
    strategies = {name: build_strategy(parse_strategy(name), target, {}, {})
                  for name in args.strategy or [BASELINE, "ngram", "draft"]}
    print(f"loaded in {time.perf_counter() - started:.1f} s; {len(prompts)} prompts, {torch.get_num_threads()} threads")
    rows = {}
    for name, strategy in strategies.items():
        ratios, totals = [], {True: [0.0, 0], False: [0.0, 0]}
        for r in range(args.rounds):
            per_path = {}
            for fast in ((False, True) if r % 2 == 0 else (True, False)):
                with fast_path(fast):
                    per_path[fast] = decode_all(target, prompts, args.max_new_tokens, strategy)
                totals[fast][0] += per_path[fast][1]
                totals[fast][1] += per_path[fast][2]
            if per_path[True][0] != per_path[False][0]:
                raise SystemExit(f"{name}: the fast path's greedy tokens differ from transformers'")
            ratios.append((per_path[True][2] / per_path[True][1]) / (per_path[False][2] / per_path[False][1]))
        rows[name] = {"hf_tokens_per_s": totals[False][1] / totals[False][0],
                      "fast_tokens_per_s": totals[True][1] / totals[True][0],
                      "fast_over_hf": statistics.median(ratios), "ratios": ratios, "identical": True}
        row = rows[name]
        print(f"{name:8s} transformers {row['hf_tokens_per_s']:7.1f} tok/s   fast {row['fast_tokens_per_s']:7.1f} tok/s"
              f"   fast/transformers {row['fast_over_hf']:.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    if args.out:
        write_json(args.out, {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                              "threads": torch.get_num_threads(), "strategies": rows})


if __name__ == "__main__":
    main()
