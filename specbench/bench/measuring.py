"""Measuring a group of suite items at a batch size: every strategy decoded, interleaved with `ar`,
and each generation made a `Row`. Batch size 1 is the group of one."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from specbench.analysis.host import peak_rss_bytes
from specbench.analysis.lossless import divergence_margin, first_divergence
from specbench.analysis.memory import needed_bytes
from specbench.bench.decode_groups import decode, prompt_seed, strategy_order
from specbench.bench.prepare import PreparedRun, fits
from specbench.core.records import Row
from specbench.decoding.decode import Generation
from specbench.decoding.target import answer_text, encode_turn
from specbench.engines.protocol import Decoded
from specbench.methods.build import Strategy
from specbench.methods.names import BASELINE
from specbench.plan.suites import SuiteItem
from specbench.report.run_dir import group_of

Key = tuple[str, int, int]  # prompt, turn, repeat
LOGGED_CHARS = 200  # of the engine's log line that flags a row


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes() or 0


def make_rows(model, strategy: Strategy, items: list[SuiteItem], turn: int, repeat: int, prompts: list[list[int]],
              decoded: Decoded, references: list[list[int] | None], peak: int, batch_size: int,
              order: int = 0) -> list[Row]:
    """One row per sequence of a group; a reference is `ar`'s greedy output (None when sampling: no greedy
    check runs, and `mismatch` is None).

    A batch's time is shared out equally, so that tokens/s over rows is the batch's throughput;
    `latency_s` is when the sequence itself finished. The memory is the whole group's: weights once,
    every sequence's KV cache and drafter state."""
    batch, n = decoded.batch, len(prompts)
    context = sum(len(p) + len(g.tokens) + g.max_verified for p, g in zip(prompts, decoded.sequences))
    memory = needed_bytes(model, strategy.drafter, context, sum(g.drafter_state_bytes for g in decoded.sequences))
    rows = []
    for item, prompt, gen, reference in zip(items, prompts, decoded.sequences, references):
        share = gen if batch is None else dataclasses.replace(
            gen, wall_s=batch.wall_s / n, prefill_s=batch.prefill_s / n, draft_s=batch.draft_s / n,
            verify_s=batch.verify_s / n, other_s=batch.other_s / n)
        tokens = len(gen.tokens)
        first = first_divergence(gen.tokens, reference) if reference is not None else None
        margin = divergence_margin(model, prompt, gen.tokens, reference, first) if first is not None else None
        batched: dict[str, Any] = {} if batch is None else {
            "batch_rows": n, "latency_s": gen.wall_s, "batch_steps": batch.steps,
            "batch_block": batch.verified / batch.rows if batch.rows else None}
        rows.append(Row(
            strategy=strategy.name, prompt_id=item.id, category=item.category, turn=turn, repeat=repeat,
            order=order, prompt_tokens=len(prompt), new_tokens=tokens, wall_s=share.wall_s, ttft_s=gen.ttft_s,
            tpot_s=(gen.wall_s - gen.ttft_s) / (tokens - 1) if tokens > 1 else None,
            steps=gen.steps, drafts=gen.drafts, tau=tokens / gen.steps if gen.steps else None,
            drafted=gen.drafted, accepted=gen.accepted, verified=gen.verified, max_verified=gen.max_verified,
            draft_depth=gen.draft_depth, budget=gen.budget, tree_steps=gen.tree_steps,
            accept_by_position=gen.accept_by_position,
            prefill_s=share.prefill_s, draft_s=share.draft_s, verify_s=share.verify_s, other_s=share.other_s,
            memory_bytes=memory, peak_mem_bytes=peak, stop_reason=gen.stop_reason,
            mismatch=None if reference is None else first is not None, first_divergence=first,
            divergence_margin=margin, output_ids=gen.tokens, batch_size=batch_size,
            steps_by_drafted=gen.steps_by_drafted, engine=strategy.engine,
            outlier=gen.engine_log[0][:LOGGED_CHARS] if gen.engine_log else None, **batched))
    return rows


def make_row(model, strategy: Strategy, item: SuiteItem, turn: int, repeat: int, prompt: list[int], gen: Generation,
             reference: list[int] | None, peak: int, order: int = 0) -> Row:
    """The row of one generation decoded alone."""
    return make_rows(model, strategy, [item], turn, repeat, [prompt], Decoded([gen]), [reference], peak, 1, order)[0]


def engine_agreement(model, prompt: list[int], engine_ar: list[int], reference_ar: list[int]) -> dict[str, Any]:
    """Another engine's `ar` against the reference engine's on one prompt: kernels differ, so a near-tie may
    flip; where they part and the target's logit margin there (from specbench's forward) say whether it was a tie."""
    first = first_divergence(engine_ar, reference_ar)
    margin = divergence_margin(model, prompt, engine_ar, reference_ar, first) if first is not None else None
    return {"engines_agree": first is None, "engines_first_divergence": first, "engines_divergence_margin": margin}


def turn_prompt(bench: PreparedRun, item: SuiteItem, turn: int, previous: dict[Key, list[int]]) -> list[int]:
    """The prompt of an item's turn: the turns before it answered with `ar`'s own answers (repeat 0's), the same
    context for every strategy."""
    tokenizer = bench.target.tokenizer
    return encode_turn(tokenizer, item, turn, [answer_text(tokenizer, previous[(item.id, t, 0)]) for t in range(turn)])


def measure_group(bench: PreparedRun, batch_size: int, items: list[SuiteItem], done: set[tuple[str, int, int, int]],
                  previous: dict[Key, list[int]], on_rows: Callable[[list[Row]], None]) -> list[str]:
    """All turns and repeats of a group of suite items decoded together (at batch size 1, one item),
    every strategy interleaved with `ar` at the same batch size; returns the items dropped because a
    later turn would not fit in the model's context (the turns before it are kept).

    Turn k holds the items with a k-th turn, in a context of `ar`'s own earlier answers (the same
    context for every strategy, so the comparison stays paired). `previous` maps (prompt, turn,
    repeat) to `ar`'s output ids measured so far, an interrupted run's included; the greedy reference
    of a sequence is the first of them, batch size 1's where it ran, so batched `ar` is checked against
    it too. Another engine's strategies are checked against that engine's own `ar`, which is checked
    against the reference engine's.
    """
    reference = bench.plan.reference
    greedy = bench.sampling.greedy
    dropped: list[str] = []
    for turn in range(max(len(item.turns) for item in items)):
        members, prompts = [], []
        for item in items:
            if len(item.turns) <= turn or item.id in dropped:
                continue
            prompt = turn_prompt(bench, item, turn, previous)
            if fits(bench.target, prompt, bench.config.max_new_tokens):
                members.append(item)
                prompts.append(prompt)
            else:
                dropped.append(item.id)
        for repeat in range(bench.config.repeats):
            keys = [(item.id, turn, repeat) for item in members]
            if all((*key, batch_size) in done for key in keys):
                continue
            seeds = [prompt_seed(bench.config.seed, item, turn, repeat) for item in members]
            generations = []
            for position, strategy in enumerate(strategy_order(bench, keys[0] if batch_size == 1
                                                               else (keys[0], batch_size))):
                if bench.target.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(bench.target.device)
                with bench.metrics.measure(strategy.label):
                    decoded = decode(bench, strategy, prompts, seeds, batch_size)
                generations.append((position, strategy, decoded, peak_memory(bench.target.device)))
            ars = {strategy.engine: decoded for _, strategy, decoded, _ in generations if strategy.name == BASELINE}
            for key, gen in zip(keys, ars[reference].sequences):
                previous.setdefault(key, gen.tokens)
            generations.sort(key=lambda g: bench.runs.index(g[1]))  # rows in run order, `ar` first
            rows = []
            for position, strategy, decoded, peak in generations:
                own_ar = [previous[key] for key in keys] if strategy.engine == reference else \
                    [g.tokens for g in ars[strategy.engine].sequences]
                references = own_ar if greedy else [None] * len(keys)
                made = make_rows(bench.target.model, strategy, members, turn, repeat, prompts, decoded, references,
                                 peak, batch_size, position)
                if greedy and strategy.engine != reference and strategy.name == BASELINE:  # against the reference
                    made = [dataclasses.replace(row, **engine_agreement(bench.target.model, prompt, row.output_ids,
                                                                        previous[key]))
                            for row, prompt, key in zip(made, prompts, keys)]
                rows += made
            # a batch runs whole; of a batch an interruption cut, only the prompts it lost are stored again
            on_rows([r for r in rows if group_of(r) not in done])
    return dropped
