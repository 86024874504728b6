"""A benchmark run: every strategy against `ar` on the same prompts, interleaved, in one process.

Data flows one way: suite -> prompts -> (target, strategy) -> per-step trace (engine) -> per-prompt
rows -> run summary. Rows are appended to the run directory prompt by prompt, so an interruption
keeps what was measured and `resume` carries on where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
import zlib
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd
import torch

from specbench.batch_plots import write_batch_plots
from specbench.config import RunConfig
from specbench.draft_schedule import cap_at
from specbench.engine.batch import BatchGeneration, drafter_copies, generate_batch
from specbench.engine.decode import Generation, generate
from specbench.engine.protocol import Controller
from specbench.engine.sampling import Sampling, seeded
from specbench.engines import SPECBENCH, VLLM, label
from specbench.errors import Interrupted, SpecbenchError
from specbench.hardware import GpuProfile, get_profile, is_local_gpu, load_profiles
from specbench.load_axis import load_axis, time_proposals
from specbench.measure.cost_table import CHAIN, TREE, CostTable, Grid, load_table
from specbench.measure.costs import drafter_context, drafter_key, measure_costs
from specbench.measure.device_metrics import RunMetrics
from specbench.measure.host import peak_rss_bytes
from specbench.measure.lossless import divergence_margin, first_divergence
from specbench.measure.memory import needed_bytes
from specbench.measure.noise import NoiseMonitor
from specbench.measure.stats import CostInputs, paired_speedups, summarize, transfer
from specbench.model_source import model_path
from specbench.models import Target, encode_turns, load_target, resolve_device, resolve_dtype
from specbench.plots import write_plots
from specbench.projection import by_batch, workload_shape
from specbench.projection import project as projection
from specbench.records import Row, RunResult, StrategySummary
from specbench.results import RunDir, group_of, write_atomic
from specbench.strategies.build import Strategy, build_strategy, verifies_trees
from specbench.strategies.controllers import CappedController
from specbench.strategies.knobs import validate_knobs
from specbench.strategies.published.formats import DrafterSource, drafter_dirs_by_strategy
from specbench.strategies.registry import definitions
from specbench.strategies.spec import BASELINE, StrategySpec, parse_strategies, parse_strategy
from specbench.suites import Suite, SuiteItem, load_suite, select

if TYPE_CHECKING:  # imported where an engine is made: vLLM is an optional extra
    from specbench.vllm_engine import VllmEngine, VllmStrategy

    VllmPlan = tuple[list[VllmStrategy], dict[str, Any]]  # the strategies' vLLM forms, the engine arguments

Progress = Callable[[str, int, int], None]  # what, done, total
Estimate = Callable[[dict[str, Any]], None]  # after the warm-up: the plan (seconds, prompts, strategies, ...)

VERIFY_MARGIN = 64  # positions a verified draft may add beyond prompt + answer
BATCHED_VERIFY_LENGTHS = (1, 2, 4, 8, 12, 16)  # the chains' verify blocks: the engine pads them to the longest draft
MAX_MODEL_LEN = 4096  # vLLM's context at most (--engine-args max_model_len overrides): its KV cache is preallocated


@dataclass
class Bench:
    """Everything a run needs, loaded once: the target, its strategies, the prompts."""

    config: RunConfig
    target: Target
    strategies: list[Strategy]
    suite: Suite
    sampling: Sampling
    metrics: RunMetrics
    profile: GpuProfile | None  # the --gpu profile to project onto
    skipped: list[str] = field(default_factory=list)  # prompts that would not fit in the model's context
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # what runs: none above the suite's size
    notes: list[str] = field(default_factory=list)  # what the run changed from its configuration
    vllm: VllmEngine | None = None  # with --engine vllm or both: vLLM's engines, one per strategy
    vllm_strategies: list[Strategy] = field(default_factory=list)

    @property
    def runs(self) -> list[Strategy]:
        """Everything measured on each prompt: specbench's strategies, then vLLM's."""
        return self.strategies + self.vllm_strategies

    def close(self) -> None:
        """Stop vLLM's engine processes, if any."""
        if self.vllm is not None:
            self.vllm.close()


def prepare(config: RunConfig) -> Bench:
    """Validate the whole configuration and load models before anything is measured."""
    config = config.validate()  # its type-checked copy, 0 for the whole suite read as no limit
    specs = parse_strategies(config.strategies)
    validate_knobs(config.knobs)
    schedule = {parse_strategy(name).name: entry for name, entry in config.draft_schedule.items()}
    sources = drafter_dirs_by_strategy(config.drafters, specs)  # formats detected before any model is loaded
    suite = select(load_suite(config.suite), config.categories or None, config.limit)
    trees = [s.name for s in specs if verifies_trees(s)]
    if trees and config.batch_sizes[-1] > 1:
        chains = ", ".join(name for name, method in definitions().items() if not method.tree)
        raise SpecbenchError(f"{', '.join(trees)} verify token trees, which run at batch size 1 only; batched "
                             f"decoding (--batch-size above 1) runs ar and {chains}")
    profile = None
    if config.gpu:
        profile = get_profile(config.gpu, load_profiles(Path(config.profiles) if config.profiles else None))
    vllm = check_vllm(config, specs, sources) if config.engine != SPECBENCH else None
    device = resolve_device(config.device)
    target = load_target(config.model, device, resolve_dtype(config.dtype, device))
    # with vLLM alone, specbench's own `ar` still runs: it is the reference the engines' agreement is read against
    own = specs if config.engine != VLLM else specs[:1]
    strategies = [build_strategy(s, target, config.knobs, sources, config.controller) for s in own]
    config = dataclasses.replace(config, draft_schedule=schedule)
    sampling = Sampling(config.temperature, config.top_p, config.top_k)
    suite, skipped = fitting_prompts(suite, target, config.max_new_tokens)
    batch_sizes, notes = fit_batch_sizes(config.batch_sizes, len(suite.items))
    bench = Bench(config, target, strategies, suite, sampling, RunMetrics(device), profile, skipped, batch_sizes, notes)
    if vllm is not None:
        start_vllm(bench, vllm, sources)
    return bench


def check_vllm(config: RunConfig, specs: list[StrategySpec], sources: dict[str, DrafterSource]) -> VllmPlan:
    """Every strategy's vLLM form and the engine arguments, refused before any model loads."""
    from specbench import vllm_engine

    strategies = [vllm_engine.translate(s, config.knobs, config.controller, sources) for s in specs]
    dtype = resolve_dtype(config.dtype, resolve_device(config.device))  # the same as specbench's target
    return strategies, vllm_engine.engine_kwargs(model_path(config.model), dtype, config.seed, config.engine_args)


def start_vllm(bench: Bench, vllm: VllmPlan, sources: dict[str, DrafterSource]) -> None:
    """vLLM's engines, one per strategy (`ar` included), with the drafters converted to vLLM's layouts."""
    from specbench import vllm_engine

    strategies, kwargs = vllm
    plans = [vllm_engine.with_drafter(s, sources, bench.target, vllm_engine.drafter_cache())
             for s in strategies]
    limit = context_limit(bench.target)
    kwargs.setdefault("max_model_len", min(limit, MAX_MODEL_LEN) if limit else MAX_MODEL_LEN)
    bench.vllm = vllm_engine.VllmEngine(kwargs)
    for plan in plans:
        bench.vllm.check(plan)
    try:
        bench.vllm_strategies = [vllm_strategy(bench, p) for p in plans]
    except BaseException:
        bench.close()
        raise
    bench.notes += [f"vLLM runs {p.name} without specbench's {', '.join(p.untranslated)} (no vLLM counterpart)"
                    for p in plans if p.untranslated]


def vllm_strategy(bench: Bench, strategy: VllmStrategy) -> Strategy:
    """A strategy decoded by its own vLLM engine, started now."""
    config = strategy.speculative_config
    described = {"vllm": {"speculative_config": config, "untranslated": list(strategy.untranslated)}} if config else {}
    return Strategy(strategy.name, None, None, drafters=described, engine=VLLM, runner=bench.vllm.start(strategy))


def fit_batch_sizes(batch_sizes: list[int], prompts: int) -> tuple[list[int], list[str]]:
    """Batch sizes above the number of prompts become that number (once); a note says so."""
    fitted = sorted({min(b, prompts) for b in batch_sizes})
    too_big = [b for b in batch_sizes if b > prompts]
    notes = [f"batch size {', '.join(map(str, too_big))} is more than the {prompts} prompts selected: "
             f"batch size {prompts} is measured instead"] if too_big else []
    return fitted, notes


def context_limit(target: Target) -> int | None:
    return getattr(target.model.config, "max_position_embeddings", None)


def fits(target: Target, prompt: list[int], max_new_tokens: int) -> bool:
    limit = context_limit(target)
    return limit is None or len(prompt) + max_new_tokens + VERIFY_MARGIN <= limit


def fitting_prompts(suite: Suite, target: Target, max_new_tokens: int) -> tuple[Suite, list[str]]:
    """The suite without the prompts whose first turn, answer and drafts would not fit in the model's
    context (never measured past it), and their ids; none fitting is an error."""
    keep, skipped = [], []
    for item in suite.items:
        ok = fits(target, encode_turns(target.tokenizer, list(item.turns[:1]), []), max_new_tokens)
        (keep if ok else skipped).append(item)
    if not keep:
        raise SpecbenchError(f"no prompt of the suite fits the model's context of {context_limit(target)} tokens "
                             f"with {max_new_tokens} new tokens; use a shorter suite or --max-new-tokens")
    return Suite(suite.name, tuple(keep)), [item.id for item in skipped]


def prompt_seed(run_seed: int, item: SuiteItem, turn: int, repeat: int = 0) -> int:
    """The seed of one generation: the run's seed and the prompt, turn and repeat, so every strategy (at
    every batch size, in run and in tune) samples a prompt from the same seed."""
    return run_seed * 1_000_003 + zlib.crc32(f"{item.id}/{turn}/{repeat}".encode())


def new_controller(bench: Bench, strategy: Strategy, batch_size: int) -> Controller | None:
    """A fresh controller for one sequence, capped where the run's draft schedule says so at this batch size."""
    if strategy.new_controller is None:
        return None
    controller = strategy.new_controller()
    entry = bench.config.draft_schedule.get(strategy.name)
    cap = cap_at(entry, batch_size) if entry else None
    return controller if cap is None else CappedController(controller, cap)


def run_one(bench: Bench, strategy: Strategy, prompt: list[int], seed: int) -> Generation:
    if strategy.runner is not None:
        return strategy.runner(prompt, bench.config.max_new_tokens, bench.sampling, seed)
    torch.manual_seed(seed)
    return generate(bench.target.model, prompt, bench.config.max_new_tokens, bench.sampling,
                    bench.target.eos_ids, strategy.drafter, new_controller(bench, strategy, 1), seed)


def run_batch(bench: Bench, strategy: Strategy, prompts: list[list[int]], seeds: list[int]) -> BatchGeneration:
    """One batch in lockstep, each sequence with its own drafter copy, controller and seeded Rng (the
    seed its prompt gets at batch size 1)."""
    torch.manual_seed(seeds[0])
    drafters = drafter_copies(strategy.drafter, len(prompts)) if strategy.drafter else None
    controllers = [new_controller(bench, strategy, len(prompts)) for _ in prompts] if strategy.drafter else None
    rngs = [seeded(seed, bench.target.device) for seed in seeds]
    return generate_batch(bench.target.model, prompts, bench.config.max_new_tokens, bench.sampling,
                          bench.target.eos_ids, drafters, controllers, rngs)


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes() or 0


def make_row(model, strategy: Strategy, item: SuiteItem, turn: int, repeat: int, prompt: list[int], gen: Generation,
             reference: list[int] | None, peak: int, order: int = 0) -> Row:
    """One measured generation as a row; `reference` is `ar`'s greedy output (None when sampling: no
    greedy check runs, and `mismatch` is None)."""
    n = len(gen.tokens)
    first = first_divergence(gen.tokens, reference) if reference is not None else None
    margin = divergence_margin(model, prompt, gen.tokens, reference, first) if first is not None else None
    return Row(
        strategy=strategy.name, prompt_id=item.id, category=item.category, turn=turn, repeat=repeat,
        order=order, prompt_tokens=len(prompt), new_tokens=n, wall_s=gen.wall_s, ttft_s=gen.ttft_s,
        tpot_s=(gen.wall_s - gen.ttft_s) / (n - 1) if n > 1 else None,
        steps=gen.steps, tau=n / gen.steps if gen.steps else None,
        drafted=gen.drafted, accepted=gen.accepted, verified=gen.verified, max_verified=gen.max_verified,
        draft_depth=gen.draft_depth, budget=gen.budget, tree_steps=gen.tree_steps,
        accept_by_position=gen.accept_by_position,
        prefill_s=gen.prefill_s, draft_s=gen.draft_s, verify_s=gen.verify_s, other_s=gen.other_s,
        memory_bytes=needed_bytes(model, strategy.drafter, len(prompt) + n + gen.max_verified, gen.drafter_state_bytes),
        peak_mem_bytes=peak, stop_reason=gen.stop_reason,
        mismatch=None if reference is None else first is not None, first_divergence=first,
        divergence_margin=margin, output_ids=gen.tokens, batch_size=1,
        steps_by_drafted=gen.steps_by_drafted, engine=strategy.engine,
    )


def engine_agreement(model, prompt: list[int], vllm_ar: list[int], specbench_ar: list[int]) -> dict[str, Any]:
    """vLLM's `ar` against specbench's on one prompt: kernels differ, so a near-tie may flip; where they
    part and the target's logit margin there (from specbench's forward) say whether it was a tie."""
    first = first_divergence(vllm_ar, specbench_ar)
    margin = divergence_margin(model, prompt, vllm_ar, specbench_ar, first) if first is not None else None
    return {"engines_agree": first is None, "engines_first_divergence": first, "engines_divergence_margin": margin}


def batch_rows(model, strategy: Strategy, items: list[SuiteItem], turn: int, repeat: int, prompts: list[list[int]],
               batch: BatchGeneration, references: list[list[int] | None], peak: int, batch_size: int,
               order: int = 0) -> list[Row]:
    """One row per sequence of a batch. Time is the batch's, shared out equally, so that tokens/s over
    rows is the batch's throughput; `latency_s` is when the sequence itself finished. The memory is the
    whole batch's: weights once, every sequence's KV cache and drafter state."""
    n = len(prompts)
    context = sum(len(p) + len(g.tokens) + g.max_verified for p, g in zip(prompts, batch.sequences))
    memory = needed_bytes(model, strategy.drafter, context, sum(g.drafter_state_bytes for g in batch.sequences))
    rows = []
    for item, prompt, gen, reference in zip(items, prompts, batch.sequences, references):
        share = dataclasses.replace(gen, wall_s=batch.wall_s / n, prefill_s=batch.prefill_s / n,
                                    draft_s=batch.draft_s / n, verify_s=batch.verify_s / n, other_s=batch.other_s / n)
        row = make_row(model, strategy, item, turn, repeat, prompt, share, reference, peak, order)
        tokens = len(gen.tokens)
        rows.append(dataclasses.replace(
            row, batch_size=batch_size, batch_rows=n, memory_bytes=memory, latency_s=gen.wall_s,
            tpot_s=(gen.wall_s - gen.ttft_s) / (tokens - 1) if tokens > 1 else None,
            batch_steps=batch.steps, batch_block=batch.verified / batch.rows if batch.rows else None))
    return rows


def warm_up(bench: Bench) -> float:
    """Run every strategy on the first prompt, and on a first batch at each batch size above 1,
    unmeasured, so lazy initialisation is not timed; the seconds the measured part takes per prompt
    (one pass over the strategies at batch size 1, a batch's share at each other batch size)."""
    prompts = [encode_turns(bench.target.tokenizer, list(item.turns[:1]), [])
               for item in bench.suite.items[:bench.batch_sizes[-1]]]
    per_prompt = 0.0
    for batch_size in bench.batch_sizes:
        started = time.perf_counter()
        for _ in range(bench.config.warmup):
            for strategy in bench.runs if batch_size == 1 else bench.strategies:
                if batch_size == 1:
                    run_one(bench, strategy, prompts[0], 0)
                else:
                    run_batch(bench, strategy, prompts[:batch_size], list(range(batch_size)))
        per_prompt += (time.perf_counter() - started) / max(1, bench.config.warmup) / batch_size
    return per_prompt


def strategy_order(bench: Bench, key: Any) -> list[Strategy]:
    """Every strategy, `ar` included, in an order shuffled per prompt (or batch) with the run's seed, so
    that no strategy always runs first or right after another (caches, clocks and load drift)."""
    order = list(bench.runs)
    random.Random(f"{bench.config.seed}/{key}").shuffle(order)
    return order


def measure_prompt(bench: Bench, item: SuiteItem, done: set[tuple[str, int, int, int]],
                   previous: dict[tuple[str, int, int], list[int]], on_rows: Callable[[list[Row]], None]) -> bool:
    """All turns and repeats of one suite item, every strategy interleaved with `ar`; False when a later
    turn's context would not fit in the model (the turns before it are kept).

    Turn k's context holds `ar`'s own answers to the earlier turns (the same context for every
    strategy, so the comparison stays paired). `previous` maps (prompt, turn, repeat) to `ar`'s
    output ids already measured in an interrupted run.
    """
    tokenizer = bench.target.tokenizer
    answers: list[str] = []
    for turn in range(len(item.turns)):
        prompt = encode_turns(tokenizer, list(item.turns[:turn + 1]), answers)
        if not fits(bench.target, prompt, bench.config.max_new_tokens):
            return False
        for repeat in range(bench.config.repeats):
            key = (item.id, turn, repeat)
            if (*key, 1) in done:
                continue
            generations = []
            for position, strategy in enumerate(strategy_order(bench, key)):
                if bench.target.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(bench.target.device)
                with bench.metrics.measure(strategy.label):
                    gen = run_one(bench, strategy, prompt, prompt_seed(bench.config.seed, item, turn, repeat))
                generations.append((position, strategy, gen, _peak_memory(bench.target.device)))
            ars = {strategy.engine: gen.tokens for _, strategy, gen, _ in generations if strategy.name == BASELINE}
            previous[key] = ars[SPECBENCH]
            generations.sort(key=lambda g: bench.runs.index(g[1]))  # rows in run order, `ar` first
            rows = [make_row(bench.target.model, strategy, item, turn, repeat, prompt, gen,
                             ars[strategy.engine] if bench.sampling.greedy else None, peak, position)
                    for position, strategy, gen, peak in generations]
            if VLLM in ars and bench.sampling.greedy:
                rows = [dataclasses.replace(row, **engine_agreement(bench.target.model, prompt, row.output_ids,
                                                                    ars[SPECBENCH]))
                        if row.engine == VLLM and row.strategy == BASELINE else row for row in rows]
            on_rows(rows)
        answers.append(tokenizer.decode(previous[(item.id, turn, 0)], skip_special_tokens=True))
    return True


def cost_inputs(bench: Bench) -> CostInputs:
    """The measured forward costs of this target and these strategies (stored under results/costs/,
    reused by later runs), at the verify lengths, masks and contexts the run can reach."""
    contexts = [64, 256] + [c for c in (1024, 4096) if c <= (context_limit(bench.target) or 0)]
    longest = max(len(encode_turns(bench.target.tokenizer, list(i.turns[:1]), [])) for i in bench.suite.items)
    contexts = [c for c in contexts if c <= 4 * (longest + bench.config.max_new_tokens)] or contexts[:1]
    grid = Grid(context_lens=tuple(contexts), masks=(CHAIN, TREE))
    context = cache(partial(drafter_context, bench.target))  # generated once, if a proposal is timed
    table: CostTable = measure_costs(bench.target.model, bench.strategies, context, bench.config.out, grid)
    batched = tuple(b for b in bench.batch_sizes if b > 1)
    if batched:  # the load axis's model at the run's batch sizes (chains only run batched)
        table = measure_costs(bench.target.model, bench.strategies, context, bench.config.out,
                              replace(grid, batch_sizes=batched, verify_lengths=BATCHED_VERIFY_LENGTHS, masks=(CHAIN,)))
    return CostInputs(table, {s.name: drafter_key(s) for s in bench.strategies if s.drafter is not None})


def measure_batch(bench: Bench, batch_size: int, items: list[SuiteItem], done: set[tuple[str, int, int, int]],
                  previous: dict[tuple[str, int, int], list[int]], on_rows: Callable[[list[Row]], None]) -> None:
    """All turns and repeats of a batch of suite items decoded together, every strategy interleaved with
    batched `ar` at the same batch size.

    Turn k holds the items with a k-th turn, in a context of `ar`'s own earlier answers, as
    measure_prompt builds it. The greedy reference of a sequence is the first `ar` output measured for
    its prompt: batch size 1's where it ran, so batched `ar` is checked against it too. The suite's last
    batch may hold fewer items than `batch_size`.
    """
    tokenizer = bench.target.tokenizer
    answers: dict[str, list[str]] = {item.id: [] for item in items}
    for turn in range(max(len(item.turns) for item in items)):
        members = [item for item in items if len(item.turns) > turn]
        prompts = [encode_turns(tokenizer, list(item.turns[:turn + 1]), answers[item.id]) for item in members]
        for repeat in range(bench.config.repeats):
            keys = [(item.id, turn, repeat) for item in members]
            if all((*key, batch_size) in done for key in keys):
                continue
            seeds = [prompt_seed(bench.config.seed, item, turn, repeat) for item in members]
            generations = []
            for position, strategy in enumerate(strategy_order(bench, (keys[0], batch_size))):
                if bench.target.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(bench.target.device)
                with bench.metrics.measure(strategy.name):
                    batch = run_batch(bench, strategy, prompts, seeds)
                generations.append((position, strategy, batch, _peak_memory(bench.target.device)))
            ar = next(batch for _, strategy, batch, _ in generations if strategy.drafter is None)
            for key, gen in zip(keys, ar.sequences):
                previous.setdefault(key, gen.tokens)
            references = [previous[key] if bench.sampling.greedy else None for key in keys]
            generations.sort(key=lambda g: bench.strategies.index(g[1]))  # rows in run order, `ar` first
            rows = [row for position, strategy, batch, peak in generations
                    for row in batch_rows(bench.target.model, strategy, members, turn, repeat, prompts, batch,
                                          references, peak, batch_size, position)]
            # a batch runs whole; of a batch an interruption cut, only the prompts it lost are stored again
            on_rows([r for r in rows if group_of(r) not in done])
        for item in members:
            answers[item.id].append(tokenizer.decode(previous[(item.id, turn, 0)], skip_special_tokens=True))


def project(bench: Bench, rows: pd.DataFrame, summary: list[StrategySummary]) -> dict[str, Any]:
    """Each strategy's measured shape on the --gpu profile, at the run's batch size and swept over
    batch sizes (where speculation stops paying there).

    When the profile is the local GPU the figures above are measured and nothing is projected.
    """
    profile = bench.profile
    if is_local_gpu(profile.name):
        return {"gpu": profile.name, "projected": False, "note": "measured on this GPU"}
    by_name = {s.name: s for s in bench.strategies}
    for result in summary:
        part = rows[rows.strategy == result.strategy]
        shape = workload_shape(bench.target.model, by_name[result.strategy].drafter, part)
        result.projection = {**projection(shape, profile), "by_batch": by_batch(shape, profile)}
    return {"gpu": profile.name, "projected": True}


def summarise(bench: Bench, result: RunResult, noise: NoiseMonitor | None, costs: CostInputs | None) -> None:
    """The result's summaries (per strategy and batch size, per category), device metrics, noise,
    projection and load axis, from its rows (which gain their paired speedups)."""
    rows = result.frame()
    rows["speedup"] = paired_speedups(rows)
    for row, speedup in zip(result.rows, rows.speedup):
        row.speedup = None if math.isnan(speedup) else float(speedup)
    for batch_size, part in rows.groupby("batch_size", sort=True):
        # the cost model predicts batch size 1 (measure/cost_model.py); the load axis models every batch size
        at = {"costs": costs if batch_size == 1 else None}
        for summary in summarize(part, bench.config.seed, **at):
            metrics = bench.metrics.summary(label(summary.strategy, summary.engine), summary.new_tokens)
            result.summary.append(replace(summary, batch_size=int(batch_size), **metrics))
        result.by_category += [replace(s, batch_size=int(batch_size))
                               for s in summarize(part, bench.config.seed, by="category", **at)]
    ratios = transfer(result.summary)
    for summary in result.summary:
        if summary.engine != SPECBENCH:
            summary.transfer = ratios.get((summary.strategy, summary.batch_size))
    own = rows[rows.engine == SPECBENCH]  # the noise check, projection and load axis read specbench's engine
    own_summary = [s for s in result.summary if s.engine == SPECBENCH]
    smallest = int(own.batch_size.min())
    first = own[own.batch_size == smallest]
    if noise is not None:
        result.noise = noise.summary(first)
    if bench.profile:
        result.projection = project(bench, first, [s for s in own_summary if s.batch_size == smallest])
    result.load = load_axis(bench.target, bench.strategies, own, own_summary, bench.config.out)


def finish(bench: Bench, run: RunDir, rows: list[Row], complete: bool, noise: NoiseMonitor | None,
           costs: CostInputs | None) -> RunResult:
    """The run's result from every row measured (those of an interrupted run included), written to its
    directory with the plots."""
    result = RunResult(run.path, {**run.meta, "status": "complete" if complete else "incomplete"}, run.config,
                       run.environment, rows, [], skipped_prompts=bench.skipped, notes=bench.notes,
                       vllm_start_s=bench.vllm.start_s if bench.vllm is not None else {},
                       nvml_series=bench.metrics.series_frame().to_dict("records"))
    if rows:
        summarise(bench, result, noise, costs)
    run.finish(result)
    if rows:
        write_plots([result], run.path)
        if "schedule_toml" in result.load:
            write_atomic(run.path / "draft_schedule.toml", result.load["schedule_toml"])
        table = load_table(bench.config.out, result.load["cost_table"]) if "cost_table" in result.load else None
        write_batch_plots(result, table)
    return result


def run_benchmark(config: RunConfig, progress: Progress | None = None, resume: str | Path | None = None,
                  on_estimate: Estimate | None = None) -> RunResult:
    """Measure every configured strategy against `ar` and write a run directory.

    With `resume`, reopen an interrupted run directory (its saved configuration wins) and measure
    only the prompts it lacks; a complete run is refused and left untouched. On KeyboardInterrupt
    while prompts are measured, the rows measured so far are kept, the run is marked incomplete
    and `Interrupted` (a KeyboardInterrupt naming the run directory) propagates. `on_estimate`
    hears, after the warm-up, how long the measured part should take.
    """
    started = time.perf_counter()  # the start-up a user waits for: loading and the warm-up (nothing is compiled)
    if resume is not None:
        run, config = RunDir.resume(resume)
        bench = prepare(config)
        if run.meta.get("strategies") != [s.label for s in bench.runs]:
            bench.close()
            raise SpecbenchError(f"{resume}: the strategies no longer match the saved run")
    else:
        bench = prepare(config)
        run = RunDir.create(config.out, config, bench.target.name, bench.suite.name, [s.label for s in bench.runs],
                            drafters={s.label: s.drafters for s in bench.runs if s.drafters})
    try:
        return measure_run(bench, run, progress, on_estimate, started)
    finally:
        bench.close()


def measure_run(bench: Bench, run: RunDir, progress: Progress | None = None, on_estimate: Estimate | None = None,
                started: float | None = None) -> RunResult:
    """The measured part of run_benchmark, on a prepared run and its run directory; `started` is when
    the user's wait began (the start-up reported is from then)."""
    config = bench.config
    started = time.perf_counter() if started is None else started
    previous: dict[tuple[str, int, int], list[int]] = {}
    rows = run.keep_complete_groups({s.label for s in bench.runs})  # an interrupted run's, read once
    done = {group_of(r) for r in rows}
    for r in rows:  # batch size 1's rows come first, and its outputs are the reference
        if r.strategy == BASELINE and r.engine == SPECBENCH:
            previous.setdefault((r.prompt_id, r.turn, r.repeat), r.output_ids)

    def keep(measured: list[Row]) -> None:
        run.append_rows(measured)
        rows.extend(measured)

    noise = NoiseMonitor()  # the load before this run adds its own
    per_prompt = warm_up(bench)
    todo = [(b, item) for b in bench.batch_sizes for item in bench.suite.items
            if any((item.id, turn, r, b) not in done for turn in range(len(item.turns)) for r in range(config.repeats))]
    if on_estimate:
        prompts = {item.id: item for _, item in todo}.values()
        generations = sum(len(item.turns) for item in prompts) * config.repeats
        on_estimate({"seconds": per_prompt * generations, "prompts": len(prompts), "strategies": len(bench.runs),
                     "load": noise.load_before, "cpus": noise.cpus, "busy": noise.busy_before(),
                     "skipped": list(bench.skipped), "context": context_limit(bench.target),
                     "startup_s": time.perf_counter() - started})
    costs = cost_inputs(bench) if config.cost_model and config.engine != VLLM else None
    time_proposals(bench.target, bench.strategies, config.out)  # what the load axis prices, timed before measuring
    noise.restart()
    complete = False
    try:
        finished = 0
        for batch_size in bench.batch_sizes:
            items = [item for b, item in todo if b == batch_size]
            for start in range(0, len(items), batch_size):
                batch = items[start:start + batch_size]
                if batch_size == 1:
                    if not measure_prompt(bench, batch[0], done, previous, keep):
                        bench.skipped.append(batch[0].id)
                else:
                    measure_batch(bench, batch_size, batch, done, previous, keep)
                noise.tick()
                finished += len(batch)
                if progress:
                    progress(f"batch size {batch_size}: {batch[-1].id}", finished, len(todo))
        complete = True
    except KeyboardInterrupt as exc:
        raise Interrupted(run.path, "the prompts finished so far are kept; the run is marked incomplete") from exc
    finally:
        result = finish(bench, run, rows, complete, noise, costs)
    return result
