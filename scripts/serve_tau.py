"""Why `serve`'s tau is not `run`'s, from the counters of the same prompts: `run`'s vLLM engine and an ngram
`vllm serve` decode the same prompts, greedy, one request at a time (the server without warm-up), and both
count drafts (verify steps that carried a draft) and accepted tokens. Printed for each: drafts, accepted
tokens, tau per drafting step (1 + accepted / drafts, what vLLM's counters give and serve's tau column
shows) and tokens per forward (output tokens / (output tokens - accepted), `run`'s tau and serve's
`tokens_per_step`). Equal counters on both sides put the whole gap between the two taus in their
definitions; runs on different prompt sets show what the prompts add.

    python scripts/serve_tau.py --limit 8 --max-new-tokens 64     # the pair docs/serve.md quotes
    python scripts/serve_tau.py --limit 66 --max-new-tokens 64    # the committed sweep's prompt set
    python scripts/serve_tau.py --limit 1 --max-new-tokens 8 --out /tmp/serve-tau   # a smoke run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import specbench

ROOT = Path(__file__).resolve().parents[1]
EAGER = {"enforce_eager": True}  # the counters do not depend on compilation, which costs minutes on a CPU


def per_step(tokens: int, drafts: int, accepted: int) -> dict[str, float | int | None]:
    return {"drafts": drafts, "accepted": accepted, "tokens": tokens,
            "tau_per_drafting_step": 1 + accepted / drafts if drafts else None,
            "tokens_per_forward": tokens / (tokens - accepted) if tokens > accepted else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=8, help="prompts of the suite, the same on both sides")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model", help="as `specbench run --model` takes it (default: the embedded model)")
    parser.add_argument("--out", type=Path, default=ROOT / "results", help="where both run directories go")
    args = parser.parse_args()
    common = {"strategies": ["ngram"], "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "out": str(args.out), "engine_args": EAGER, **({"model": args.model} if args.model else {})}
    ran = specbench.run(engine="vllm", **common)
    rows = [r for r in ran.rows if r.strategy == "ngram"]
    served = specbench.serve(concurrency=[1], requests=args.limit, warmup=0, **common)
    spec = next(e for e in served.levels if e.strategy == "ngram").speculation
    tokens = next(e for e in served.levels if e.strategy == "ngram").output_tokens
    summary = next(s for s in ran.summary if s.strategy == "ngram")
    figures = {"prompts": args.limit, "max_new_tokens": args.max_new_tokens,
               "run": {**per_step(sum(r.new_tokens for r in rows), sum(r.drafts or 0 for r in rows),
                                  sum(r.accepted for r in rows)), "summary_tau": summary.tau, "dir": str(ran.path)},
               "serve": {**per_step(tokens, spec.drafts or 0, spec.accepted or 0), "level_tau": spec.tau,
                         "dir": str(served.path)}}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
