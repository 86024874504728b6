"""Run the embedded drafters, written in vLLM's layouts, in vLLM and report tau and the greedy identity.

    VLLM_CPU_KVCACHE_SPACE=1 python scripts/check_vllm_drafters.py --strategy eagle,dflash --limit 4 --max-new-tokens 64

For each strategy: vLLM with speculative_config {method, model: the converted drafter,
num_speculative_tokens} on the embedded target (float32, eager), greedy on the first turns of the
default suite (chat template, as specbench encodes them); tau = 1 + accepted / drafts from
llm.get_metrics(), and whether the outputs equal vLLM's own plain decoding. Compare with
`python -m specbench run --strategy ... --limit 4 --max-new-tokens 64 --json`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

DEFAULT_TOKENS = {"eagle": 3, "dflash": 7, "dspark": 6}


def counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters, summed over engines."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            out[metric.name] = out.get(metric.name, 0) + metric.value
    return out


def generate(target_dir: Path, prompts: list[list[int]], max_new_tokens: int, spec: dict | None):
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=str(target_dir), dtype="float32", enforce_eager=True, max_model_len=1024,
              speculative_config=spec, disable_log_stats=False, max_num_seqs=4, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    stats = counters(llm)
    del llm
    return tokens, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="eagle,dflash")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--cache", type=Path, default=None, help="where the converted drafters are written")
    args = parser.parse_args()

    import torch

    from specbench.models import ASSETS, encode_turns, load_target
    from specbench.strategies.published.to_vllm import method, vllm_drafter_dir
    from specbench.suites import load_suite, select

    target = load_target(None, torch.device("cpu"), torch.float32)
    suite = select(load_suite("default"), None, args.limit)
    prompts = [encode_turns(target.tokenizer, list(item.turns[:1]), []) for item in suite.items]
    target_dir = ASSETS / "default" / "target"
    cache = args.cache or Path(tempfile.mkdtemp(prefix="vllm-drafters-"))
    plain, _ = generate(target_dir, prompts, args.max_new_tokens, None)
    report = {}
    for strategy in args.strategy.split(","):
        model = vllm_drafter_dir(strategy, None, target, cache)
        k = args.num_speculative_tokens or DEFAULT_TOKENS[strategy]
        tokens, stats = generate(target_dir, prompts, args.max_new_tokens,
                                 {"method": method(strategy), "model": str(model), "num_speculative_tokens": k})
        drafts = stats.get("vllm:spec_decode_num_drafts", 0)
        accepted = stats.get("vllm:spec_decode_num_accepted_tokens", 0)
        report[strategy] = {"drafter": str(model), "num_speculative_tokens": k, "drafts": drafts,
                            "accepted": accepted, "tau": 1 + accepted / drafts if drafts else None,
                            "same_as_plain": tokens == plain,
                            "mismatched_prompts": sum(a != b for a, b in zip(tokens, plain))}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
