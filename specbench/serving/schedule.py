"""From a sweep to decisions: where each strategy stops paying, how much load it holds within the SLO,
and the per-load setting that follows, in vLLM's own form.

- crossover: the lowest measured closed-loop concurrency at which the strategy's TPOT speedup over `ar`
  is 1 or less (it stops paying there); None while it pays at every level measured, or where a level
  before it has no verdict (a failed request, or no `ar` to compare with).
- capacity: the highest measured level up to which every level kept the p99 of each SLO metric within
  its limit without errors (practitioners' write-ups: "holds P99 < 200 ms up to 8 concurrent requests").
- schedule: speculate with the strategy's own draft length below its crossover, not at all from it on,
  as vLLM's `num_speculative_tokens_per_batch_size` (concurrency stands in for the running batch size).
"""

from __future__ import annotations

from typing import Any

from specbench.draft_schedule import vllm_ranges


def crossover(points: list[tuple[float, float | None]]) -> float | None:
    """The first level (increasing) whose speedup is 1 or less, unless a level without a verdict comes first;
    `points` are (level, speedup or None for no verdict)."""
    for x, speedup in sorted(points, key=lambda point: point[0]):
        if speedup is None:
            return None
        if speedup <= 1.0:
            return x
    return None


def capacity(points: list[tuple[float, bool]]) -> float | None:
    """The highest level up to which every level met the SLO; None when the lowest did not."""
    held = None
    for x, met in sorted(points):
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
