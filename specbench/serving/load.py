"""Load shapes: a closed loop of N clients, or open-loop arrivals at a request rate.

Closed loop: N clients, each sending its next request when its last one ends, so N requests are in
flight all the time (`vllm bench serve --max-concurrency N` with every request queued at once). Open
loop: requests arrive at `rate` per second with gamma-distributed gaps of shape `burstiness` (1 is a
Poisson process, below 1 burstier), as `vllm bench serve --request-rate --burstiness` draws them, at
most `max_concurrency` in flight. The warm-up's requests carry the first `warmup` prompts; measured
request i carries prompt warmup + first + i, `first` the level's own offset (at --endpoint servers, past
every earlier level's prompts; cycling over the prompts after the warm-up's when there are too few, which
the caller allows only when the user asks for repeats), and the arrival times come from the seed, so
every strategy gets the same requests in the same order and the levels pair.

A level is bounded twice: `requests` measured requests, and no new request after `seconds`. Warm-up
requests go first, at the same load, and are not recorded; the server's speculative counters are read
after them and right after the last measured request, so the level's acceptance is its measured
requests' alone (or, where either scrape fails, absent and said to be).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specbench.core.records.serve_records import RequestRecord, Speculation
from specbench.serving import server_metrics
from specbench.serving.client import Prompt, request_body, served_model, session, stream_completion
from specbench.serving.serve_config import Level


@dataclass(frozen=True)
class Workload:
    """The prompts in their order and how each is answered."""

    prompts: list[Prompt]
    max_tokens: int  # an answer's length at most, every prompt's own included
    temperature: float
    seed: int
    ignore_eos: bool = False  # every answer max_tokens long (vLLM's extension of the API)
    endpoint_type: str = "completions"  # or "chat": the server applies its own chat template to the text
    vllm: bool = True  # the servers are vLLM: requests carry its own fields (return_token_ids, ignore_eos)


@dataclass
class LevelLog:
    records: list[RequestRecord]
    duration_s: float  # from the first measured request sent to the last one answered
    stopped_by_time: bool  # the time bound ended the level before every request was sent
    speculation: Speculation | None = None  # the server's speculative counters (server_metrics.py)
    counters_missing: str | None = None  # why the level has no counters: its /metrics failed before or after it


def arrival_times(rate: float, burstiness: float, count: int, seed: int) -> np.ndarray:
    """Seconds from the level's start at which each request arrives: gamma gaps of mean 1 / rate."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count))


async def closed_loop(send: Callable, clients: int, count: int, deadline: float) -> list[RequestRecord]:
    """`clients` clients sending requests 0..count-1 in order, each its next when its last is answered."""
    records: list[RequestRecord] = []
    next_index = 0

    async def client() -> None:
        nonlocal next_index
        while next_index < count and time.perf_counter() < deadline:
            index, next_index = next_index, next_index + 1
            records.append(await send(index))

    await asyncio.gather(*(client() for _ in range(clients)))
    return sorted(records, key=lambda r: r.index)


async def open_loop(send: Callable, arrivals: np.ndarray, max_concurrency: int | None,
                    deadline: float) -> list[RequestRecord]:
    """Requests sent at their arrival times (relative to now), at most `max_concurrency` in flight."""
    start = time.perf_counter()
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    tasks = []

    async def gated(index: int) -> RequestRecord:
        if gate is None:
            return await send(index)
        async with gate:
            return await send(index)

    for index, at in enumerate(arrivals):
        delay = start + float(at) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() >= deadline:
            break
        tasks.append(asyncio.create_task(gated(index)))
    return list(await asyncio.gather(*tasks))


async def drive(base_url: str, level: Level, workload: Workload, requests: int, warmup: int, seconds: float,
                max_concurrency: int | None = None, burstiness: float = 1.0, model: str | None = None,
                on_answer: Callable[[], None] | None = None, headers: dict[str, str] | None = None,
                request_timeout: float | None = None, first_prompt: int = 0) -> LevelLog:
    """Warm the server up, then measure one level: every request's record, the level's duration;
    `on_answer` is called as each measured request ends. Measured request i carries prompt `first_prompt` + i
    after the warm-up's. A request not answered within `request_timeout` seconds fails; without one it may
    take as long as the level and ten minutes more (the time bound stops new requests, not ones in flight).
    A server that names no model at /v1/models raises ModelsFailed before anything is sent."""
    timeout_s = request_timeout or seconds + 600
    # the prompts after the warm-up's; all of them where a caller allowing repeats has no more (tune's few)
    measured = workload.prompts[warmup:] or workload.prompts
    async with session(headers or {}) as client:
        model = model or await served_model(client, base_url)
        origin, measuring = 0.0, False

        async def send(index: int) -> RequestRecord:
            prompt = measured[(first_prompt + index) % len(measured)] if measuring else \
                workload.prompts[index % len(workload.prompts)]
            record = RequestRecord(index, prompt.id, sent=time.perf_counter() - origin)
            path, body = request_body(workload.endpoint_type, model, prompt, prompt.max_tokens or workload.max_tokens,
                                      workload.temperature, workload.seed + index, workload.ignore_eos, workload.vllm)
            await stream_completion(client, base_url, path, body, record, timeout_s)
            if measuring and on_answer:
                on_answer()
            return record

        async def shape(count: int, deadline: float) -> list[RequestRecord]:
            if level.concurrency is not None:
                return await closed_loop(send, level.concurrency, count, deadline)
            return await open_loop(send, arrival_times(level.request_rate, burstiness, count, workload.seed),
                                   max_concurrency, deadline)

        if warmup:
            origin = time.perf_counter()
            await shape(warmup, origin + seconds)
        before, missing = await counters(base_url, headers or {}, "before")
        origin, measuring = time.perf_counter(), True
        records = await shape(requests, origin + seconds)
        after, missing_after = await counters(base_url, headers or {}, "after")
        missing = missing or missing_after
        ends = [r.sent + (r.e2e or 0.0) for r in records]
        duration = max(ends, default=0.0) - min((r.sent for r in records), default=0.0)
        speculation = None if missing else \
            server_metrics.speculation(before, after, sum(r.output_tokens for r in records))
        return LevelLog(records, duration, len(records) < requests, speculation, missing)


async def counters(base_url: str, headers: dict[str, str], when: str) -> tuple[dict, str | None]:
    """The server's counters scraped `when` ("before" or "after") the level, and why there are none where the
    scrape failed."""
    try:
        return await server_metrics.scrape(base_url, headers), None
    except server_metrics.ScrapeFailed as exc:
        return {}, f"its /metrics failed {when} the level ({exc})"
