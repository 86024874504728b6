"""A level's figures from its request log, and each strategy's against `ar` at the same level.

Per level, as `vllm bench serve` reports them: requests and errors, output tokens/s and requests/s over
the level's duration, p50/p90/p99 of TTFT, TPOT, ITL (every gap between streamed chunks, pooled: vLLM's
ITL) and E2E in milliseconds; beside them the ITL per token (each gap spread over the tokens its chunk
carried, as SGLang's bench_serving counts it: a speculative chunk carries every token a verify step
accepted); and goodput: requests/s that met every SLO given, with the share of requests that did (failed
ones among the requests, as AIPerf's good_request_fraction) and its exact 95% interval. Latencies, the
SLO share and the pairs against `ar` are the level's steady state's (window.py): requests sent while the
server filled up or answered while it drained are left out, and the count kept is recorded. Against `ar`
at the same level the requests pair by index (the same prompt): the TPOT speedup is the geometric mean
of per-request TPOT ratios (ar's over the strategy's) with a 95% bootstrap interval over requests; the
throughput ratio is the levels' output tokens/s over ar's, its interval from the paired requests'
per-user rates (tokens / E2E), which is what a closed loop's throughput is made of.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binomtest, bootstrap

from specbench.analysis.stats import geometric_mean_ci
from specbench.core.records.serve_records import Against, LevelFigures, Percentiles, RequestRecord
from specbench.serving.window import steady_state

PERCENTILES = (50, 90, 99)
MS = 1000.0
MIN_P99_SAMPLES = 100  # below this many values a p99 is within one sample of the maximum: flagged, not trusted


def percentiles(values: list[float], more: tuple[float, ...] = ()) -> Percentiles:
    """p50/p90/p99 in milliseconds (numpy's linear interpolation, as vllm bench serve's), None when empty, and
    `n`, the values they come from; `more` percentiles beside them, named as `p95`, `p99.9`."""
    ms = np.asarray(values) * MS

    def at(p: float) -> float | None:
        return float(np.percentile(ms, p)) if values else None

    return Percentiles(*(at(p) for p in PERCENTILES), len(values), {f"p{p:g}": at(p) for p in more})


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """An answered request within every limit of `slo` (milliseconds)."""
    if record.error is not None:
        return False
    measured = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2e": record.e2e}
    return all(measured[key] * MS <= limit for key, limit in slo.items())


def level_summary(records: list[RequestRecord], duration_s: float, slo: dict[str, float],
                  steady: bool = True, more: tuple[float, ...] = ()) -> LevelFigures:
    """The level's figures; its latencies and SLO share over its steady state (window.py) unless `steady` is
    False (every answered request, as `vllm bench serve` reports them) or the level has none; the latencies'
    `more` percentiles beside p50/p90/p99."""
    ok = [r for r in records if r.error is None]
    window = steady_state(records) if steady else []
    timed = window or ok
    tokens = sum(r.output_tokens for r in ok)
    tpot = percentiles([r.tpot for r in timed if r.tpot is not None], more)
    summary = LevelFigures(
        requests=len(records),
        errors=len(records) - len(ok),
        error_rate=(len(records) - len(ok)) / len(records) if records else None,
        duration_s=duration_s,
        output_tokens=tokens,
        output_tok_s=tokens / duration_s if duration_s > 0 else None,
        req_s=len(ok) / duration_s if duration_s > 0 else None,
        steady_requests=len(window),
        ttft_ms=percentiles([r.ttft for r in timed], more),
        tpot_ms=tpot,
        itl_ms=percentiles([gap for r in timed for gap in r.itl], more),
        itl_token_ms=percentiles([gap for r in timed for gap in r.itl_per_token], more),
        e2e_ms=percentiles([r.e2e for r in timed], more),
        few_for_p99=tpot.n < MIN_P99_SAMPLES,
        tok_s_per_user=MS / tpot.p50 if tpot.p50 else None,
    )
    if slo:
        summary.goodput_req_s = sum(meets_slo(r, slo) for r in records) / duration_s if duration_s > 0 else None
        counted = timed + [r for r in records if r.error is not None]  # a failed request misses
        good = sum(meets_slo(r, slo) for r in counted)
        summary.slo_met = good / len(counted) if counted else None
        summary.slo_met_ci = share_interval(good, len(counted))
    return summary


def share_interval(hits: int, trials: int) -> list[float | None]:
    """The exact (Clopper-Pearson) 95% interval of a share of `hits` in `trials`; [None, None] without trials."""
    if not trials:
        return [None, None]
    interval = binomtest(hits, trials).proportion_ci(confidence_level=0.95, method="exact")
    return [float(interval.low), float(interval.high)]


def paired(records: list[RequestRecord], baseline: list[RequestRecord]) -> list[tuple[RequestRecord, RequestRecord]]:
    """(strategy's, ar's) records of the same request index, both answered."""
    ar = {r.index: r for r in baseline if r.error is None}
    return [(r, ar[r.index]) for r in records if r.error is None and r.index in ar]


def against_baseline(records: list[RequestRecord], baseline: list[RequestRecord], summary: LevelFigures,
                     baseline_summary: LevelFigures, seed: int) -> Against:
    """TPOT speedup and throughput ratio over `ar` at the same level, each with its 95% interval."""
    pairs = paired(steady_state(records) or records, steady_state(baseline) or baseline)
    ratios = np.array([b.tpot / r.tpot for r, b in pairs if r.tpot and b.tpot])
    speedup = list(geometric_mean_ci(ratios, seed)) if len(ratios) else [None] * 3
    base_rate = baseline_summary.output_tok_s
    throughput = summary.output_tok_s / base_rate if base_rate and summary.output_tok_s else None
    interval = [throughput, throughput]
    usable = [(r, b) for r, b in pairs if r.e2e and b.e2e]
    if throughput is not None and len(usable) >= 2:
        own = np.array([[r.output_tokens, r.e2e, b.output_tokens, b.e2e] for r, b in usable], dtype=float)

        def rate_ratio(rows: np.ndarray) -> float:
            return float((rows[:, 0].sum() / rows[:, 1].sum()) / (rows[:, 2].sum() / rows[:, 3].sum()))

        centre = rate_ratio(own)
        res = bootstrap((np.arange(len(own)),), lambda i: rate_ratio(own[i.astype(int)]), vectorized=False,
                        confidence_level=0.95, n_resamples=1000, method="percentile",
                        random_state=np.random.default_rng(seed))
        low, high = res.confidence_interval
        # the interval of the per-user rate ratio, moved to sit around the measured throughput ratio
        if math.isfinite(low) and math.isfinite(high) and centre > 0:
            interval = [throughput * low / centre, throughput * high / centre]
    return Against(speedup[0], speedup[1:], throughput, interval, len(pairs))
