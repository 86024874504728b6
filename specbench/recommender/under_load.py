"""A strategy for a load, from `specbench serve` evidence: what paid at that concurrency on a real server.

Every serve run under the results directory that measured the concurrency offers its strategies there: the
TPOT speedup over `ar` at that load (with its interval), the throughput ratio, where the strategy stops
paying and its exported per-load vLLM setting. A strategy whose greedy answers differed from ar's at that
level is not offered: a recommendation is lossless or it is not one. With no strategy paying, the
answer is plain decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json
from specbench.core.records.serve_records import ServeResult
from specbench.methods.names import BASELINE
from specbench.serving.serve_dir import SERVE_JSON


def serve_evidence(results_dir: Path, model: str | None = None) -> list[tuple[Path, ServeResult]]:
    """(run directory, its summary.json) of every summarised serve run, of `model` only when given."""
    found = []
    for meta_file in sorted(Path(results_dir).glob(f"**/{SERVE_JSON}")):
        summary = meta_file.parent / "summary.json"
        if not summary.is_file():
            continue
        if model is None or read_json(meta_file, "serve run file")["model"] == model:
            found.append((meta_file.parent, ServeResult.from_json(read_json(summary, "serve summary"), str(summary))))
    return found


def recommend_for_load(results_dir: Path, concurrency: int, model: str | None = None) -> dict[str, Any]:
    """The best lossless strategy at `concurrency` (highest TPOT speedup above 1), the others, and the runs."""
    evidence = serve_evidence(results_dir, model)
    if not evidence:
        raise SpecbenchError(f"no serve runs under {results_dir}: measure the load first, e.g. "
                             f"specbench serve --concurrency {concurrency}")
    candidates, measured = [], set()
    for path, summary in evidence:
        for e in summary.levels:
            if e.concurrency is None:
                continue
            measured.add(e.concurrency)
            if e.concurrency != concurrency or e.strategy == BASELINE or e.tpot_speedup is None:
                continue
            if e.errors or e.baseline_errors:  # a level where requests failed is no evidence
                continue
            verdict = summary.strategies.get(e.strategy)
            candidates.append({"strategy": e.strategy, "run": str(path), "tpot_speedup": e.tpot_speedup,
                               "tpot_speedup_ci": e.tpot_speedup_ci, "throughput_ratio": e.throughput_ratio,
                               "mismatches": e.lossless.mismatches if e.lossless else None,
                               "crossover": verdict.crossover if verdict else None,
                               "vllm_speculative_config": summary.schedules.get(e.strategy)})
    if not candidates:
        raise SpecbenchError(f"no serve run measured concurrency {concurrency} against ar; measured: "
                             f"{', '.join(map(str, sorted(measured))) or 'none'}")
    candidates.sort(key=lambda c: -c["tpot_speedup"])
    paying = [c for c in candidates if c["tpot_speedup"] > 1 and not c["mismatches"]]
    return {"concurrency": concurrency, "choice": paying[0] if paying else None, "candidates": candidates,
            "runs": sorted({c["run"] for c in candidates})}
