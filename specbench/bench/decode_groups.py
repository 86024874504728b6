"""Decoding for the bench: one strategy on a group of prompts at a batch size, unmeasured or measured.

Every group decodes in its strategy's engine (engines/, `Backend.decode`): specbench's single-sequence
loop for a group of one, its lockstep loop above; another engine's own decoding. Every sequence samples
from its prompt's seed (`prompt_seed`), the same at every batch size and in tune.
"""

from __future__ import annotations

import gc
import random
import time
import zlib
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator

from specbench.bench.prepare import PreparedRun
from specbench.core.records import WarmUp
from specbench.decoding.decode import Generation
from specbench.engines.protocol import Compiles, Decoded
from specbench.methods.build import Strategy
from specbench.plan.suites import SuiteItem

SETTLED = 0.10  # an engine that compiles is warmed until two passes in a row agree within this share


def prompt_seed(run_seed: int, item: SuiteItem, turn: int, repeat: int = 0) -> int:
    """The seed of one generation: the run's seed and the prompt, turn and repeat, so every strategy (at
    every batch size, in run and in tune) samples a prompt from the same seed."""
    return run_seed * 1_000_003 + zlib.crc32(f"{item.id}/{turn}/{repeat}".encode())


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's garbage collection paused, as timeit pauses it while it times: a full collection walks every
    live object of the process (suffix decoding's tries of the run's answers hold hundreds of thousands), a
    quarter of a second at a time on the embedded model's runs, and lands in whichever decoding it happens
    to. It runs between decodings instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode(bench: PreparedRun, strategy: Strategy, prompts: list[list[int]], seeds: list[int],
           batch_size: int) -> Decoded:
    """The group at its batch size (the suite's last batch may hold fewer prompts), in the strategy's engine,
    without garbage collection meanwhile (`collection_paused`)."""
    with collection_paused():
        return bench.backends[strategy.engine].decode(strategy, prompts, seeds, bench.sampling,
                                                      bench.config.max_new_tokens, batch_size)


def run_one(bench: PreparedRun, strategy: Strategy, prompt: list[int], seed: int) -> Generation:
    """One sequence alone, in the strategy's engine."""
    return decode(bench, strategy, [prompt], [seed], 1).sequences[0]


def strategy_order(bench: PreparedRun, key: Any) -> list[Strategy]:
    """Every strategy of the run, `ar` included, in an order shuffled per prompt (or batch) with
    the run's seed, so that no strategy always runs first or right after another (caches, clocks and
    load drift)."""
    order = list(bench.runs)
    random.Random(f"{bench.config.seed}/{key}").shuffle(order)
    return order


def timed_decode(bench: PreparedRun, strategy: Strategy, prompts: list[list[int]], batch_size: int) -> float:
    """The seconds one unmeasured decoding of the group takes."""
    started = time.perf_counter()
    decode(bench, strategy, prompts, list(range(len(prompts))), batch_size)
    return time.perf_counter() - started


def settled(times: list[float]) -> bool:
    """Whether the last two passes came within SETTLED of each other."""
    return len(times) >= 2 and abs(times[-1] - times[-2]) <= SETTLED * min(times[-2:])


def timed_passes(once: Callable[[], float], least: int, most: int, calibrate: bool) -> list[float]:
    """`once` run `least` times, and where `calibrate`d on until its time settles or it has run `most` times
    (pyperf's calibration of warm-ups); each pass's seconds."""
    times: list[float] = []
    while len(times) < least or (calibrate and len(times) < most and not settled(times)):
        times.append(once())
    return times


def warm_up(bench: PreparedRun) -> float:
    """Every strategy decoded, unmeasured, on the shapes the measured prompts meet, so that lazy initialisation
    and an engine's compilation for a new shape are not timed: at each batch size, the batch of the shortest
    prompts and the batch of the longest, `warmup` passes each, and in an engine that compiles (`Compiles`)
    repeated until two passes in a row agree within SETTLED, at most `warmup_cap` passes. What each covered goes
    to `bench.warmups`, and a note names a strategy whose warm-up did not settle. Returns the seconds the measured
    part takes per prompt (each strategy's last passes, a batch's share at batch sizes above 1)."""
    config = bench.config
    if not config.warmup:
        return 0.0
    prompts = sorted(bench.first_turns, key=len)
    per_prompt = 0.0
    for batch_size in bench.batch_sizes:
        batches = [prompts[:batch_size]] + ([prompts[-batch_size:]] if len(prompts) > batch_size else [])
        for strategy in bench.runs:
            engine = bench.backends[strategy.engine]
            calibrate = isinstance(engine, Compiles) and engine.compiles(strategy)
            passes = [timed_passes(partial(timed_decode, bench, strategy, b, batch_size), config.warmup,
                                   max(config.warmup, config.warmup_cap), calibrate) for b in batches]
            warmed = WarmUp(strategy.label, batch_size, [len(batches[0][0]), len(batches[-1][-1])],
                            [len(p) for p in passes], sum(map(sum, passes)),
                            all(map(settled, passes)) if calibrate else None, [p[-1] for p in passes])
            bench.warmups.append(warmed)
            per_prompt += sum(warmed.last_s) / len(batches) / batch_size
            if warmed.settled is False:
                bench.notes.append(f"{strategy.label}'s warm-up did not settle within {config.warmup_cap} passes "
                                   f"(two in a row within {SETTLED:.0%}): its first measured prompts may still compile")
    return per_prompt
