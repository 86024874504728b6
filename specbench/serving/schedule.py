"""From a sweep to decisions: where each strategy stops paying, how much load it holds within the SLO,
and the per-load setting that follows, in vLLM's own form.

- verdict: a level's TPOT speedup over `ar` pays where its 95% interval lies above 1 and stops paying
  where it lies below; an interval that holds 1 is no verdict (too few requests to tell), nor is a level
  with a failed request or without `ar` to compare with.
- crossover: the lowest measured closed-loop concurrency at which the strategy stops paying; None while
  it pays at every level measured, or where a level before it has no verdict.
- capacity: the highest measured level up to which every level had at least a given share of its requests
  meet every SLO at once (per-request goodput, as `vllm bench serve --goodput` counts a request good and
  AIPerf's SLA search gates on good_request_fraction), decided by the share's 95% interval: a level holds
  where the interval lies at or above the share, fails where it lies below, and is undecided otherwise or
  where a request failed. Each metric's own p99 (`vllm bench sweep serve_sla`'s `p99_ttft_ms<=...`) lets
  one request miss TTFT and another TPOT; a user is served well only by a request that meets all.
- schedule: speculate with the strategy's own draft length below the first level where it is not shown
  to pay (its crossover, or a level without a verdict before it), not at all from there on, as vLLM's
  `num_speculative_tokens_per_batch_size` (concurrency stands in for the running batch size).
"""

from __future__ import annotations

from typing import Any

from specbench.methods.draft_schedule import vllm_ranges

PAYS, STOPS = "pays", "stops paying"


def speedup_verdict(interval: list[float | None] | None) -> str | None:
    """PAYS where the speedup's 95% interval lies above 1, STOPS where it lies below, None where it holds 1."""
    low, high = interval or (None, None)
    if low is not None and low > 1.0:
        return PAYS
    if high is not None and high < 1.0:
        return STOPS
    return None


def crossover(points: list[tuple[float, str | None]]) -> float | None:
    """The first level (increasing) where the strategy stops paying, unless a level without a verdict comes
    first; `points` are (level, PAYS, STOPS or None for no verdict)."""
    for x, verdict in sorted(points, key=lambda point: point[0]):
        if verdict != PAYS:
            return x if verdict == STOPS else None
    return None


def paying_until(points: list[tuple[float, str | None]]) -> float | None:
    """The first level (increasing) where the strategy is not shown to pay; None where it pays at every one."""
    return next((x for x, verdict in sorted(points, key=lambda point: point[0]) if verdict != PAYS), None)


def share_verdict(interval: list[float | None] | None, share: float) -> bool | None:
    """True where the 95% interval of the share of requests meeting the SLO lies at or above `share`, False
    where it lies below, None where it holds `share` (too few requests to tell)."""
    low, high = interval or (None, None)
    if low is not None and low >= share:
        return True
    if high is not None and high < share:
        return False
    return None


def capacity(points: list[tuple[float, bool | None]]) -> float | None:
    """The highest level up to which every level held the SLO; None when the lowest did not or is undecided."""
    held = None
    for x, met in sorted(points, key=lambda point: point[0]):
        if not met:
            break
        held = x
    return held


def vllm_schedule(speculative_config: dict[str, Any], stops_at: int | None) -> dict[str, Any] | None:
    """The strategy's speculative_config with its draft length below `stops_at` and none from it on;
    as it is while it never stops paying, None (serve without speculation) when it stops at once."""
    if stops_at is None:
        return dict(speculative_config)
    if stops_at <= 1:
        return None
    draft = int(speculative_config.get("num_speculative_tokens") or 1)
    entry = {"batch_sizes": [1, stops_at], "draft_tokens": [draft, 0]}
    return {**speculative_config, "num_speculative_tokens": draft, "num_speculative_tokens_per_batch_size":
            vllm_ranges(entry)}
