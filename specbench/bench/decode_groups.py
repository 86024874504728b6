"""Decoding for the bench: one strategy on a group of prompts at a batch size, unmeasured or measured.

Every group decodes in its strategy's engine (engines/, `Backend.decode`): specbench's single-sequence
loop for a group of one, its lockstep loop above; another engine's own decoding. Every sequence samples
from its prompt's seed (`prompt_seed`), the same at every batch size and in tune.
"""

from __future__ import annotations

import random
import time
import zlib
from typing import Any

from specbench.bench.prepare import PreparedRun
from specbench.decoding.decode import Generation
from specbench.decoding.target import encode_turn
from specbench.engines.protocol import Decoded
from specbench.methods.build import Strategy
from specbench.plan.suites import SuiteItem


def prompt_seed(run_seed: int, item: SuiteItem, turn: int, repeat: int = 0) -> int:
    """The seed of one generation: the run's seed and the prompt, turn and repeat, so every strategy (at
    every batch size, in run and in tune) samples a prompt from the same seed."""
    return run_seed * 1_000_003 + zlib.crc32(f"{item.id}/{turn}/{repeat}".encode())


def decode(bench: PreparedRun, strategy: Strategy, prompts: list[list[int]], seeds: list[int],
           batch_size: int) -> Decoded:
    """The group at its batch size (the suite's last batch may hold fewer prompts), in the strategy's engine."""
    return bench.backends[strategy.engine].decode(strategy, prompts, seeds, bench.sampling, bench.config.max_new_tokens,
                                                  batch_size)


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


def warm_up(bench: PreparedRun) -> float:
    """Run every strategy on the first prompt, and on a first batch at each batch size above 1,
    unmeasured, so lazy initialisation is not timed; the seconds the measured part takes per prompt
    (one pass over the strategies at batch size 1, a batch's share at each other batch size)."""
    prompts = [encode_turn(bench.target.tokenizer, item)
               for item in bench.suite.items[:bench.batch_sizes[-1]]]
    per_prompt = 0.0
    for batch_size in bench.batch_sizes:
        started = time.perf_counter()
        for _ in range(bench.config.warmup):
            for strategy in bench.runs:
                decode(bench, strategy, prompts[:batch_size], list(range(batch_size)), batch_size)
        per_prompt += (time.perf_counter() - started) / max(1, bench.config.warmup) / batch_size
    return per_prompt
