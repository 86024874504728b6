"""Draft schedules: how many tokens a strategy drafts per step at each batch size.

A run config's `[draft_schedule.NAME]` table (batch_sizes = [...], draft_tokens = [...]) caps the
drafts per step from each listed batch size on, as vLLM's `num_speculative_tokens_per_batch_size`
does: a batch size between two entries takes the lower one's cap, 0 means plain decoding. The best
schedule a run's measurements model (analysis/batch_model.best_caps) is written in that form, and
in vLLM's where the method has a vLLM counterpart.
"""

from __future__ import annotations

from typing import Any


def cap_at(entry: dict[str, list[int]], batch: int) -> int | None:
    """The cap at `batch`: that of the largest listed batch size not above it; None below the first."""
    caps = [k for b, k in zip(entry["batch_sizes"], entry["draft_tokens"]) if b <= batch]
    return caps[-1] if caps else None


def schedule_entry(best: list[dict[str, Any]]) -> dict[str, list[int]]:
    """best_caps' rows as a `[draft_schedule.NAME]` table."""
    return {"batch_sizes": [int(p["batch_size"]) for p in best], "draft_tokens": [int(p["draft_tokens"]) for p in best]}


def schedule_toml(schedules: dict[str, dict[str, list[int]]], source: str) -> str:
    """A TOML fragment `specbench run --config` reads."""
    lines = [f"# best draft tokens per step at each batch size, modelled from {source}", ""]
    for strategy, entry in schedules.items():
        name = f'"{strategy}"' if "+" in strategy else strategy
        lines += [f"[draft_schedule.{name}]", f"batch_sizes = {entry['batch_sizes']}",
                  f"draft_tokens = {entry['draft_tokens']}", ""]
    return "\n".join(lines)


def vllm_ranges(entry: dict[str, list[int]]) -> list[list[int]]:
    """The schedule as vLLM's `num_speculative_tokens_per_batch_size`: inclusive [first, last, cap] batch-size
    ranges starting at 1 (vLLM requires it and carries the last range's cap on to larger batches;
    vllm/v1/spec_decode/dynamic/utils.py)."""
    sizes, caps = entry["batch_sizes"], entry["draft_tokens"]
    ranges: list[list[int]] = []
    start = 0
    for i in range(len(sizes)):
        if i + 1 == len(sizes) or caps[i + 1] != caps[start]:
            end = sizes[i + 1] - 1 if i + 1 < len(sizes) else sizes[i]
            ranges.append([1 if not ranges else sizes[start], end, caps[start]])
            start = i + 1
    return ranges


def vllm_config(method: str | None, entry: dict[str, list[int]]) -> dict[str, Any] | None:
    """vLLM's speculative_config form of `method` (registry.vllm_method) with the schedule; None where vLLM
    has no such method or where no batch size drafts at all."""
    if method is None or max(entry["draft_tokens"]) == 0:
        return None
    return {"method": method, "num_speculative_tokens": max(entry["draft_tokens"]),
            "num_speculative_tokens_per_batch_size": vllm_ranges(entry)}
