"""Anchor `specbench serve`'s figures to `vllm bench serve`'s on one running server.

Both clients drive the same server (started here with the target alone, or --url of one running) with the
same prompts (specbench's, chat template applied; vLLM's custom dataset with --skip-chat-template and
--disable-shuffle), every answer exactly --max-new-tokens long (ignore_eos in both: the text prompts vLLM
tokenizes again need not end an answer where the token ids do), greedy, at the same closed-loop
concurrency. The two alternate for --rounds rounds; each figure is the median over rounds. specbench's
TTFT p50, TPOT p50 and output tokens/s should agree with vLLM's within 10%.

Writes results/benchmarks/serve_anchor.{json,md}.

    python scripts/serve_anchor.py --concurrency 4 --limit 32 --max-new-tokens 64
    python scripts/serve_anchor.py --smoke --out /tmp/anchor-smoke      # minutes: 4 prompts, 2 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from specbench.core.files import write_atomic, write_json
from specbench.decoding.model_source import model_path
from specbench.serving.level_stats import level_summary
from specbench.serving.load import drive
from specbench.serving.serve_config import Level, ServeConfig, serve_config
from specbench.serving.server import Server
from specbench.serving.sweep import workload
from specbench.serving.vllm_args import server_arguments

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {"ttft_p50_ms": "median_ttft_ms", "tpot_p50_ms": "median_tpot_ms", "output_tok_s": "output_throughput"}
TOLERANCE = 0.10


def specbench_figures(url: str, config: ServeConfig, level: Level) -> dict[str, float]:
    work = dataclasses.replace(workload(config), ignore_eos=True)
    requests = config.requests_at(level)
    log = asyncio.run(drive(url, level, work, requests, config.warmup, config.level_seconds))
    summary = level_summary(log.records, log.duration_s, {}, steady=False)  # every request, as vllm bench serve
    assert summary.errors == 0, f"{summary.errors} requests failed"
    return {"ttft_p50_ms": summary.ttft_ms.p50, "tpot_p50_ms": summary.tpot_ms.p50,
            "output_tok_s": summary.output_tok_s, "output_tokens": summary.output_tokens}


def vllm_figures(url: str, config: ServeConfig, level: Level, dataset: Path) -> dict[str, float]:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    requests = config.requests_at(level)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", model_path(None),
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template", "--disable-shuffle",
        "--custom-output-len", str(config.run.max_new_tokens), "--num-prompts", str(requests),
        "--max-concurrency", str(level.concurrency), "--request-rate", "inf", "--temperature", "0",
        "--num-warmups", str(config.warmup), "--seed", str(config.run.seed), "--ignore-eos"])
    result = main(args)
    return {**{ours: float(result[theirs]) for ours, theirs in FIGURES.items()},
            "output_tokens": result["total_output_tokens"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a running server of the embedded target (else one is started here)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks")
    parser.add_argument("--smoke", action="store_true", help="4 prompts, 16 tokens, 2 rounds: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.limit, args.max_new_tokens, args.rounds = 4, 16, 2
    # --limit measured requests, each a prompt of its own, beside the warm-up's two
    config = serve_config({"strategies": ["ar"], "limit": args.limit + 2, "max_new_tokens": args.max_new_tokens},
                          concurrency=[args.concurrency], warmup=2, requests=args.limit)
    level = config.levels[0]
    tokenizer = AutoTokenizer.from_pretrained(model_path(None))
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "prompts.jsonl"
        # the prompts as text, chat template applied: vLLM tokenizes them back to specbench's token ids
        dataset.write_text("".join(json.dumps({"prompt": tokenizer.decode(prompt.token_ids)}) + "\n"
                                   for prompt in workload(config).prompts))
        server = None
        if args.url is None:
            arguments = server_arguments(config.plan, lambda: None)["ar"]
            server = Server("ar", arguments, Path(tmp) / "server.log", start_timeout=900)
            server.start()
        try:
            url = args.url or server.url
            rounds = [{"specbench": specbench_figures(url, config, level),
                       "vllm_bench_serve": vllm_figures(url, config, level, dataset)} for _ in range(args.rounds)]
        finally:
            if server is not None:
                server.stop()
    medians = {client: {k: statistics.median(r[client][k] for r in rounds) for k in FIGURES}
               for client in ("specbench", "vllm_bench_serve")}
    ratios = {k: medians["specbench"][k] / medians["vllm_bench_serve"][k] for k in FIGURES}
    report = {"concurrency": args.concurrency, "prompts": args.limit, "max_new_tokens": args.max_new_tokens,
              "requests": config.requests_at(level), "rounds": rounds, "medians": medians,
              "specbench_over_vllm": ratios, "tolerance": TOLERANCE,
              "within_tolerance": all(abs(r - 1) <= TOLERANCE for r in ratios.values())}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "serve_anchor.json", report)
    lines = ["# specbench serve against vllm bench serve", "",
             f"One server of the embedded target, concurrency {args.concurrency}, {report['requests']} requests of "
             f"{args.max_new_tokens} new tokens, greedy; medians of {args.rounds} alternating rounds.", "",
             "| figure | specbench | vllm bench serve | ratio |", "| --- | --- | --- | --- |"]
    tokens = [r[client]["output_tokens"] for r in rounds for client in ("specbench", "vllm_bench_serve")]
    lines += [f"| {k} | {medians['specbench'][k]:.2f} | {medians['vllm_bench_serve'][k]:.2f} | {ratios[k]:.3f} |"
              for k in FIGURES]
    lines += ["", f"Output tokens per round (specbench, vLLM, ...): {', '.join(map(str, tokens))}.",
              f"Within {TOLERANCE:.0%}: {'yes' if report['within_tolerance'] else 'NO'}.", ""]
    write_atomic(args.out / "serve_anchor.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
