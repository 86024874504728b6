"""Decoding for the bench: one strategy on a group of prompts at a batch size, unmeasured or measured.

A group of one decodes in the strategy's engine (its runner: specbench's single-sequence loop, or
another engine's own decoding); a larger group decodes in specbench's loop in lockstep, each sequence
with its own drafter copy, controller and seeded Rng. Every sequence samples from its prompt's seed
(`prompt_seed`), the same at every batch size and in tune.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from specbench.backends.specbench import new_controller
from specbench.benchmark.prepare import PreparedRun
from specbench.engine.batch import BatchGeneration, drafter_copies, generate_batch
from specbench.engine.decode import Generation
from specbench.engine.sampling import seeded
from specbench.models import encode_turn
from specbench.strategies.build import Strategy
from specbench.suites import SuiteItem


def prompt_seed(run_seed: int, item: SuiteItem, turn: int, repeat: int = 0) -> int:
    """The seed of one generation: the run's seed and the prompt, turn and repeat, so every strategy (at
    every batch size, in run and in tune) samples a prompt from the same seed."""
    return run_seed * 1_000_003 + zlib.crc32(f"{item.id}/{turn}/{repeat}".encode())


def run_one(bench: PreparedRun, strategy: Strategy, prompt: list[int], seed: int) -> Generation:
    """One sequence alone, in the strategy's engine."""
    return strategy.runner(prompt, bench.config.max_new_tokens, bench.sampling, seed)


def run_batch(bench: PreparedRun, strategy: Strategy, prompts: list[list[int]], seeds: list[int]) -> BatchGeneration:
    """One batch in lockstep, each sequence with its own drafter copy, controller and seeded Rng."""
    torch.manual_seed(seeds[0])
    drafters = drafter_copies(strategy.drafter, len(prompts)) if strategy.drafter else None
    controllers = ([new_controller(strategy, bench.config.draft_schedule, len(prompts)) for _ in prompts]
                   if strategy.drafter else None)
    rngs = [seeded(seed, bench.target.device) for seed in seeds]
    return generate_batch(bench.target.model, prompts, bench.config.max_new_tokens, bench.sampling,
                          bench.target.eos_ids, drafters, controllers, rngs)


@dataclass
class Decoded:
    """One strategy's generations of a group of prompts, and the batch's own figures where the group was
    decoded in lockstep (None: one sequence, decoded alone)."""

    sequences: list[Generation]
    batch: BatchGeneration | None = None


def decode(bench: PreparedRun, strategy: Strategy, prompts: list[list[int]], seeds: list[int],
           batch_size: int) -> Decoded:
    """The group at batch size 1 (one prompt) or in lockstep at a larger batch size (the suite's last
    batch may hold fewer prompts)."""
    if batch_size == 1:
        return Decoded([run_one(bench, strategy, prompts[0], seeds[0])])
    batch = run_batch(bench, strategy, prompts, seeds)
    return Decoded(batch.sequences, batch)


def strategies_at(bench: PreparedRun, batch_size: int) -> list[Strategy]:
    """What runs at a batch size: everything at 1, specbench's own strategies batched (the other engines
    here decode one sequence at a time)."""
    return bench.runs if batch_size == 1 else bench.strategies


def strategy_order(bench: PreparedRun, batch_size: int, key: Any) -> list[Strategy]:
    """Every strategy at the batch size, `ar` included, in an order shuffled per prompt (or batch) with
    the run's seed, so that no strategy always runs first or right after another (caches, clocks and
    load drift)."""
    order = list(strategies_at(bench, batch_size))
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
            for strategy in strategies_at(bench, batch_size):
                decode(bench, strategy, prompts[:batch_size], list(range(batch_size)), batch_size)
        per_prompt += (time.perf_counter() - started) / max(1, bench.config.warmup) / batch_size
    return per_prompt
