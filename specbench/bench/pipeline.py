"""A benchmark run: every strategy against `ar` on the same prompts, interleaved, in one process.

Data flows one way: suite -> prompts -> (target, strategy) -> per-step trace (engine) -> rows
(bench/measuring.py) -> the run's result (bench/summarise.py). Rows are appended to the run directory group by
group, so an interruption keeps what was measured and `resume` carries on where it stopped.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import cache, partial
from typing import Any, Callable

from specbench.analysis.cost_table import CHAIN, TREE, CostTable, Grid
from specbench.analysis.noise import NoiseMonitor
from specbench.analysis.stats import CostInputs
from specbench.bench.cost_timing import drafter_context, drafter_key, engine_table, measure_costs
from specbench.bench.decode_groups import warm_up
from specbench.bench.measuring import measure_group
from specbench.bench.modelled_speedup import time_proposals
from specbench.bench.prepare import PreparedRun, prepare
from specbench.bench.remeasure import remeasure_outliers
from specbench.bench.summarise import finish
from specbench.core.errors import Interrupted, SpecbenchError
from specbench.core.records import Row, RunResult
from specbench.decoding.drafting import Drafter
from specbench.decoding.target import context_limit
from specbench.engines.protocol import KeepsLog, TimesTarget
from specbench.methods.build import Strategy
from specbench.methods.combine import CombinedDrafter
from specbench.methods.combine_options import COMBINE
from specbench.methods.names import BASELINE
from specbench.plan.run_config import RunPlan
from specbench.report.run_dir import RunDir, group_of

Progress = Callable[[str, int, int], None]  # what, done, total
Estimate = Callable[[dict[str, Any]], None]  # after the warm-up: the plan (seconds, prompts, strategies, ...)

BATCHED_VERIFY_LENGTHS = (1, 2, 4, 8, 12, 16)  # the chains' verify blocks: the engine pads them to the longest draft
ENGINE_VERIFY_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)  # another engine's chains (longer ones extrapolate)


def cost_inputs(bench: PreparedRun) -> CostInputs:
    """The measured forward costs of this target and these strategies (stored under results/costs/,
    reused by later runs), at the verify lengths, masks and contexts the run can reach: the reference
    engine's strategies priced with the forwards specbench times, another engine's with its own where it
    times them (`TimesTarget`)."""
    contexts = [64, 256] + [c for c in (1024, 4096) if c <= (context_limit(bench.target) or 0)]
    longest = max(map(len, bench.first_turns))
    contexts = [c for c in contexts if c <= 4 * (longest + bench.config.max_new_tokens)] or contexts[:1]
    grid = Grid(context_lens=tuple(contexts), masks=(CHAIN, TREE))
    context = cache(partial(drafter_context, bench.target))  # generated once, if a proposal is timed
    with_members = bench.strategies + member_strategies(bench.strategies)
    table: CostTable = measure_costs(bench.target.model, with_members, context, bench.config.out, grid)
    batched = tuple(b for b in bench.batch_sizes if b > 1)
    if batched:  # the load axis's model at the run's batch sizes (chains only run batched)
        table = measure_costs(bench.target.model, bench.strategies, context, bench.config.out,
                              replace(grid, batch_sizes=batched, verify_lengths=BATCHED_VERIFY_LENGTHS, masks=(CHAIN,)))
    tables = {bench.plan.reference: table}
    for name, engine in bench.backends.items():
        if name == bench.plan.reference or not any(s.engine == name for s in bench.engine_strategies
                                                   if s.name != BASELINE):
            continue
        timed = engine.target_costs(list(contexts), list(ENGINE_VERIFY_LENGTHS), grid.repeats, grid.warmup) \
            if isinstance(engine, TimesTarget) else None
        if timed:
            tables[name] = engine_table(table, name, timed)
        else:
            bench.notes.append(f"{engine.title}'s forwards are not timed apart: the cost model predicts no speedup "
                               "for its strategies")
    return CostInputs(tables, {s.name: drafter_key(s) for s in bench.strategies if s.drafter is not None})


def routed(strategies: list[Strategy]) -> list[Strategy]:
    """The combinations whose router weighs costs."""
    return [s for s in strategies if isinstance(s.drafter, CombinedDrafter) and s.drafter.combine.routes]


def member_strategies(strategies: list[Strategy]) -> list[Strategy]:
    """The members with a network of the routed combinations, as strategies of their own: the cost table
    times their proposals (a member run alone too shares its entry), so the router can price them."""
    return [member_strategy(member, new) for s in routed(strategies)
            for member, new in zip(s.drafter.members, s.drafter.new_controllers) if member.model is not None]


def member_strategy(member: Drafter, new_controller) -> Strategy:
    """A combination's member as a strategy of its own, keyed in the cost table as the member run alone."""
    return Strategy(member.name, member, new_controller)


def price_combinations(bench: PreparedRun, table: CostTable) -> list[str]:
    """The routed combinations priced by this machine's measured forwards, at the run's typical context (the
    median prompt and half an answer): a verify of n positions from the target's verify curve, each member's
    proposal at a budget, after the tokens it sat out, from its timed proposals, both in target forwards of one
    (each read once), where `combine.node_cost` and `combine.draft_cost` are not set; a note says what they
    read."""
    combined = routed(bench.strategies)
    knobs = bench.config.knobs.get(COMBINE, {})
    if not combined or ("node_cost" in knobs and "draft_cost" in knobs):
        return []
    prompts = sorted(map(len, bench.first_turns))
    context = prompts[len(prompts) // 2] + bench.config.max_new_tokens // 2
    one = table.target_s(1, context)
    verify = cache(lambda positions: table.target_s(positions, context, tree=True) / one)

    def proposal(member: Drafter, new_controller) -> Callable[[int, int], float]:
        key = drafter_key(member_strategy(member, new_controller))
        return cache(lambda budget, backlog: (table.drafter_s(key, budget) + table.catch_up_s(key, backlog)) / one)

    priced = {}
    for strategy in combined:
        drafter = strategy.drafter
        costs = [proposal(m, new) if m.model is not None else None
                 for m, new in zip(drafter.members, drafter.new_controllers)]
        drafter.price(None if "node_cost" in knobs else verify, None if "draft_cost" in knobs else costs)
        priced.update({m.name: (new().budget(), cost) for m, new, cost in
                       zip(drafter.members, drafter.new_controllers, costs) if cost is not None})
    verifying = "" if "node_cost" in knobs else (f"a verify of 8 positions {verify(8):.2f}, 16 {verify(16):.2f}, "
                                                 f"32 {verify(32):.2f}")
    drafting = "" if "draft_cost" in knobs else "a proposal " + ", ".join(
        f"{name} {cost(budget, 1):.2f} (budget {budget}; {cost(budget, 64):.2f} after 64 tokens)"
        for name, (budget, cost) in sorted(priced.items()))
    return [f"{', '.join(s.name for s in combined)} priced from this machine's forwards at context {context}, in "
            f"target forwards: {'; '.join(p for p in (verifying, drafting) if p)} (combine.node_cost and "
            "combine.draft_cost set them instead)"]


def run_benchmark(plan: RunPlan, progress: Progress | None = None, resume: RunDir | None = None,
                  on_estimate: Estimate | None = None) -> RunResult:
    """Measure every strategy of the plan against `ar` and write a run directory.

    With `resume`, an interrupted run directory reopened by `RunDir.resume` (the plan is its saved
    configuration's), measure only the prompts it lacks. On KeyboardInterrupt while prompts are
    measured, the rows measured so far are kept, the run is marked incomplete and `Interrupted` (a
    KeyboardInterrupt naming the run directory) propagates. `on_estimate` hears, after the warm-up, how
    long the measured part should take.
    """
    started = time.perf_counter()  # the start-up a user waits for: loading and the warm-up (nothing is compiled)
    bench = prepare(plan)
    labels = [s.label for s in bench.runs]
    if resume is not None and resume.meta.strategies != labels:
        bench.close()
        raise SpecbenchError(f"{resume.path}: the strategies no longer match the saved run")
    run = resume or RunDir.create(plan.config.out, plan.config, bench.target.name, bench.suite.name, labels,
                                  drafters={s.label: s.drafter_sources for s in bench.runs if s.drafter_sources})
    try:
        return measure_run(bench, run, progress, on_estimate, started)
    finally:
        bench.close()
        for engine in bench.backends.values():  # what the engines printed, once they have stopped
            if isinstance(engine, KeepsLog):
                engine.keep_log(run.path)


def measure_run(bench: PreparedRun, run: RunDir, progress: Progress | None = None, on_estimate: Estimate | None = None,
                started: float | None = None) -> RunResult:
    """The measured part of run_benchmark, on a prepared run and its run directory; `started` is when
    the user's wait began (the start-up reported is from then)."""
    config = bench.config
    started = time.perf_counter() if started is None else started
    previous: dict[tuple[str, int, int], list[int]] = {}
    rows = run.keep_complete_groups({s.label for s in bench.runs})  # an interrupted run's, read once
    done = {group_of(r) for r in rows}
    for r in rows:  # batch size 1's rows come first, and its outputs are the reference
        if r.strategy == BASELINE and r.engine == bench.plan.reference:
            previous.setdefault((r.prompt_id, r.turn, r.repeat), r.output_ids)

    def keep(measured: list[Row]) -> None:
        # memory first: an interruption inside the append (Ctrl-C lands after the fsync returns) must not
        # leave rows on disk that finish, which rewrites rows.jsonl from memory, does not know of
        rows.extend(measured)
        run.append_rows(measured)

    noise = NoiseMonitor()  # the load before this run adds its own
    per_prompt = warm_up(bench)  # records what it covered in bench.warmups, and a note where it did not settle
    todo = [(b, item) for b in bench.batch_sizes for item in bench.suite.items
            if any((item.id, turn, r, b) not in done for turn in range(len(item.turns)) for r in range(config.repeats))]
    if on_estimate:
        prompts = {item.id: item for _, item in todo}.values()
        generations = sum(len(item.turns) for item in prompts) * config.repeats
        on_estimate({"seconds": per_prompt * generations, "prompts": len(prompts), "strategies": len(bench.runs),
                     "load": noise.load_before, "cpus": noise.cpus, "busy": noise.busy_before(),
                     "skipped": list(bench.skipped), "context": context_limit(bench.target),
                     "startup_s": time.perf_counter() - started, "cost_model": config.cost_model})
    # the cost model prices proposals as the reference engine times them, whose strategies run only where it
    # is listed (else `ar` alone)
    costs = cost_inputs(bench) if config.cost_model and bench.plan.reference in bench.plan.engines else None
    if costs is not None:
        bench.notes += price_combinations(bench, costs.tables[bench.plan.reference])
    priced = time_proposals(bench.target, bench.strategies, config.out)  # the load axis's, timed before measuring
    noise.restart()
    complete = False
    try:
        finished = 0
        for batch_size in bench.batch_sizes:
            items = [item for b, item in todo if b == batch_size]
            for start in range(0, len(items), batch_size):
                batch = items[start:start + batch_size]
                dropped = measure_group(bench, batch_size, batch, done, previous, keep)
                bench.skipped += [item for item in dropped if item not in bench.skipped]
                noise.tick()
                finished += len(batch)
                if progress:
                    progress(f"batch size {batch_size}: {batch[-1].id}", finished, len(todo))
        rows[:] = remeasure_outliers(bench, rows, previous)
        complete = True
    except KeyboardInterrupt as exc:
        raise Interrupted(run.path, "the prompts finished so far are kept; the run is marked incomplete") from exc
    finally:
        result = finish(bench, run, rows, complete, noise, costs, priced)
    return result
