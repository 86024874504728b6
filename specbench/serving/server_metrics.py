"""A server's own speculative-decoding counters, read from its Prometheus /metrics around a level.

vLLM counts drafts (verify steps that carried drafts), draft tokens, accepted tokens and accepted tokens
per draft position (vllm/v1/spec_decode/metrics.py); the level's figures are the differences of the
counters after and before it: tau = 1 + accepted / drafts (the bonus token included) and, per position
k, accepted-at-k / drafts, the per-position acceptance vLLM's own documentation derives. vLLM counts a
draft only where a step proposed one, so its tau is per drafting step; a method that often proposes
nothing (ngram without a match) reads much higher than `run`'s tau, which counts every forward. So the
level also gets tokens_per_step = output tokens / forwards, each forward committing one token and the
drafts it accepted (forwards = tokens - accepted), as `run` counts them. SGLang exports
gauges of the mean accepted length instead (`sglang:spec_accept_length`), read as they stand after the
level. A server with neither has no speculative figures; a /metrics that fails before or after a level
leaves that level without them, and says so, rather than differencing counters of other requests.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from specbench.core.records.serve_records import Speculation

VLLM_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}
VLLM_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"


def parse(text: str) -> dict[str, Any]:
    """The speculative counters of one /metrics page, summed over engines: {"drafts": n, ..., "by_position":
    [n0, n1, ...]}, and SGLang's accepted length; empty when the server exports none."""
    counters: dict[str, float] = defaultdict(float)
    by_position: dict[int, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = sample.name.removesuffix("_total")
            if name in VLLM_COUNTERS:
                counters[VLLM_COUNTERS[name]] += sample.value
            elif name == VLLM_PER_POSITION:
                by_position[int(sample.labels["position"])] += sample.value
            elif name == SGLANG_ACCEPT_LENGTH:
                counters["sglang_accept_length"] = sample.value
    found: dict[str, Any] = dict(counters)
    if by_position:
        found["by_position"] = [by_position[k] for k in range(max(by_position) + 1)]
    return found


class ScrapeFailed(Exception):
    """/metrics did not answer (an error status other than 404, a lost connection, a timeout): the counters of
    the level it bounds are unknown."""


async def scrape(base_url: str, headers: dict[str, str]) -> dict[str, Any]:
    """parse() of the server's /metrics; empty where it has none (404); ScrapeFailed where it failed."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=headers) as client:
        try:
            async with client.get(f"{base_url}/metrics", allow_redirects=False) as response:
                if response.status == 404:
                    return {}
                if response.status != 200:
                    raise ScrapeFailed(f"HTTP {response.status}")
                return parse(await response.text())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ScrapeFailed(type(exc).__name__) from None


def speculation(before: dict[str, Any], after: dict[str, Any], output_tokens: int) -> Speculation | None:
    """The level's tau, tokens per step and per-position acceptance from the counters before and after it
    and the `output_tokens` its requests received; None without any."""
    if "drafts" in after:
        drafts = after["drafts"] - before.get("drafts", 0.0)
        accepted = after["accepted"] - before.get("accepted", 0.0)
        drafted = after["draft_tokens"] - before.get("draft_tokens", 0.0)
        old = before.get("by_position", [])
        positions = [v - (old[k] if k < len(old) else 0.0) for k, v in enumerate(after.get("by_position", []))]
        return Speculation(source="vllm", drafts=int(drafts), draft_tokens=int(drafted), accepted=int(accepted),
                           tau=1 + accepted / drafts if drafts else None,
                           tokens_per_step=output_tokens / (output_tokens - accepted) if output_tokens > accepted
                           else None, draft_efficiency=accepted / drafted if drafted else None,
                           acceptance_by_position=[v / drafts for v in positions] if drafts else [])
    if "sglang_accept_length" in after and math.isfinite(after["sglang_accept_length"]):
        return Speculation(source="sglang", tau=after["sglang_accept_length"])
    return None
