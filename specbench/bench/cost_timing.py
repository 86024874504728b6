"""Measured forward costs: what one target verify forward and one drafter proposal take on this device.

The target is timed at batch B x verify length n x context c (a KV cache of c positions per row,
then n new tokens per row, with a chain's causal mask or a tree mask), and each drafter's `propose`
at each draft budget, always after the same real context (DRAFTER_CONTEXT tokens). Above batch 1
chains go through the batched engine's own forward (decoding/batch.py: per-row positions and masks);
trees, which the engine verifies at batch 1 only, are timed with the same tree mask in every row,
for the model's batch axis. The batched
engine's step overhead (acceptance, compaction, commits) is timed too, at each batch size and block
length. Drafters run per sequence (decoding/batch.py), so a batch's drafting costs B proposals: the
table holds one. Each entry is the median of repeats after a warm-up, with its spread
(interquartile range over the median). A table is stored under results/costs/ keyed by model,
device, dtype, torch version and a digest of the engine's and drafters' source; drafters are keyed
inside it by strategy, knobs and weights, and entries already measured are reused instead of timed again.

The cost model (analysis/stats.py) predicts a strategy's speedup from these costs and the tau and
draft shape a run measured, never from the strategy's own step times.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import time
import types
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from specbench import decoding as engine_package
from specbench import methods as strategies_package
from specbench.analysis import noise
from specbench.analysis.cost_table import BATCH_GRID, CHAIN, TREE, CostTable, Grid, absorbed, load_table, table_path
from specbench.analysis.host import cpu_name
from specbench.core.files import write_json
from specbench.decoding.batch import forward_block, generate_batch
from specbench.decoding.decode import forward, generate, prefill
from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.kv_cache import new_cache, per_layer_type, repeat_rows, run_model, truncate
from specbench.decoding.sampling import Sampling, seeded
from specbench.decoding.target import DEFAULT_MODEL, encode_turn, fingerprint
from specbench.decoding.tree import DraftTree, tree_attention_mask
from specbench.methods.base import own_drafter
from specbench.methods.build import Strategy, build_strategy
from specbench.methods.controllers import FixedController
from specbench.methods.names import parse_strategy
from specbench.methods.published.formats import drafter_dirs_by_strategy
from specbench.methods.registry import DRAFTER_NAMES, definition
from specbench.plan.suites import load_suite

Progress = Callable[[str, int, int], None]  # what, done, total

TREE_WIDTH = 4  # the test trees are complete 4-ary trees: the mask's shape, not its content, sets the cost


DRAFTER_CONTEXT = 128  # tokens a drafter has absorbed when its proposals are timed (drafter_context)

def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


@functools.cache
def code_digest() -> str:
    """A digest of the source of what is timed (the engine and the drafters): a forward that changed
    (another kernel, a fused product) costs something else, so its old entries are not reused."""
    digest = hashlib.sha256()
    for package in (engine_package, strategies_package):
        for source in sorted(Path(package.__file__).parent.rglob("*.py")):
            digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def table_key(model: torch.nn.Module) -> dict[str, str]:
    device = model.device
    return {"model": fingerprint(model), "device": device_name(device),
            "dtype": str(model.dtype).removeprefix("torch."), "torch": torch.__version__,
            "threads": str(torch.get_num_threads()) if device.type == "cpu" else "-",
            "drafter_context": str(DRAFTER_CONTEXT), "code": code_digest()}


def drafter_key(strategy: Strategy) -> str:
    """Strategy name, each member's knobs and a digest of its weights: what the cost of a proposal depends on."""
    digest = hashlib.sha256(strategy.name.encode())
    for member in strategy.drafter.members:
        digest.update(repr(member.options).encode())
        for p in member.model.parameters() if member.model is not None else ():
            digest.update(p.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return f"{strategy.name}:{digest.hexdigest()[:12]}"


def _time_rounds(fns: list[Callable[[], None]], repeats: int, warmup: int, device: torch.device,
                 setup: Callable[[], None] = lambda: None) -> list[dict[str, float]]:
    """Median seconds of each of `fns` over `repeats` runs after `warmup` (each after an untimed
    `setup`), and the spread (IQR / median). Timed in rounds, each once per round: a slow spell of
    the machine, which lasts seconds, then lands on every entry alike instead of on the few timed
    during it, so the entries' ratios (what the models use) hold."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(warmup + repeats):
        for i, fn in enumerate(fns):
            setup()
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if round_ >= warmup:
                times[i].append(time.perf_counter() - start)
    return [_timing(t) for t in times]


def engine_table(table: CostTable, engine: str, timed: list) -> CostTable:
    """`table` with the target's forwards as another engine times them (its `target_costs`, TimesTarget, batch 1,
    chains): that engine's strategies are priced with its own forwards and with the proposals of the same
    drafters (their weights and knobs), timed in specbench's engine."""
    rows = [{"batch": 1, "tokens": t.tokens, "context": t.context, "mask": CHAIN, **_timing(t.seconds)}
            for t in timed]
    return replace(table, key={**table.key, "engine": engine}, target=rows, overhead=[])


def _timing(times: list[float]) -> dict[str, float]:
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {"median_s": float(median), "spread": float((q3 - q1) / median) if median > 0 else 0.0}


@contextmanager
def recorded_load(entries: list[dict]) -> Iterator[None]:
    """Record in each entry timed inside the block how busy other processes kept the CPUs meanwhile
    (over the whole block: a single entry is too short for the CPU counters), for cost_table.trusted."""
    with noise.Window() as window:
        yield
    for entry in entries:
        entry.setdefault("others_cpu", window.share)


def complete_tree(nodes: int, width: int = TREE_WIDTH) -> DraftTree:
    """`nodes` nodes filled breadth first, `width` children each."""
    tree = DraftTree()
    for i in range(nodes):
        tree.add(0, (i // width) - 1 if i >= width else -1, "cost")
    return tree


def filled_cache(model, batch: int, context: int):
    """A cache of `context` positions in each of `batch` rows: one row's prefill repeated (what the
    keys hold does not change what a forward over them costs)."""
    cache = new_cache(model)
    if context:
        run_model(model, cache, torch.randint(model.config.vocab_size, (1, context), device=model.device))
        repeat_rows(cache, batch)
    return cache


def verify_forward(model, ids: torch.Tensor, cache, context: int, tree: DraftTree | None) -> None:
    """One verify forward of ids (batch, n) after `context` cached positions, as the engine runs it:
    decode.forward at batch 1, the batched engine's forward above; a tree gets its mask in every row."""
    batch = ids.shape[0]
    if batch == 1:
        forward(model, ids[0], cache, tree, ())
    elif tree is None:
        forward_block(model, list(ids), torch.full((batch,), context, device=ids.device), cache, ())
    else:
        positions = (context + torch.tensor([0] + tree.depths(), device=ids.device)).expand(batch, -1)
        mask = per_layer_type(model.config, lambda window: tree_attention_mask(
            tree, context, model.dtype, ids.device, window).expand(batch, -1, -1, -1))
        run_model(model, cache, ids, positions, mask)


@torch.inference_mode()
def time_targets(model, batch: int, context: int, shapes: list[tuple[int, str]], repeats: int,
                 warmup: int) -> list[dict]:
    """One verify forward of each (tokens, mask) of `shapes` per row over `context` cached positions,
    timed in rounds (the cache is cut back to those positions after each forward)."""
    device = model.device
    cache = filled_cache(model, batch, context)

    def verify(tokens: int, mask: str) -> Callable[[], None]:
        ids = torch.randint(model.config.vocab_size, (batch, tokens), device=device)
        tree = complete_tree(tokens - 1) if mask == TREE else None

        def run() -> None:
            verify_forward(model, ids, cache, context, tree)
            truncate(cache, context)
        return run

    timings = _time_rounds([verify(n, m) for n, m in shapes], repeats, warmup, device)
    return [{"batch": batch, "tokens": n, "context": context, "mask": m, **t} for (n, m), t in zip(shapes, timings)]


class FixedChain:
    """A drafter proposing `depth` copies of one token: what the batched engine's bookkeeping costs
    around a verify block of depth + 1, whatever the drafts are."""

    name = "cost"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, depth: int):
        self.depth = depth

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.chain([0] * min(self.depth, ctx.budget), self.name)

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def state_bytes(self) -> int:
        return 0


OVERHEAD_PROMPT = 16  # tokens per sequence: the overhead hardly depends on the context, the forwards do


def time_overhead(model, batch: int, tokens: int, steps: int) -> dict:
    """The batched engine's step time outside the drafters and the forward (acceptance, compaction,
    commits), at `batch` rows and a verify block of `tokens`, over `steps` measured steps."""
    drafters = [FixedChain(tokens - 1)] * batch if tokens > 1 else None
    controllers = [FixedController(tokens - 1)] * batch if tokens > 1 else None
    prompts = [list(range(1, OVERHEAD_PROMPT + 1))] * batch
    run = generate_batch(model, prompts, steps + 1, drafters=drafters, controllers=controllers)
    times = [other for _, _, other in run.step_times[1:steps + 1]] or [run.step_times[0][2]]
    return {"batch": batch, "tokens": tokens, **_timing(times)}


def scratch_copy(drafter: Drafter) -> Drafter:
    """`drafter` with state of its own and the same networks and tensors: timing the copy leaves the run's
    drafter as it was (suffix decoding keeps a history of the run's answers, which timing would fill with
    its context). Every network and tensor it reaches is shared, not copied (a drafter holds the target's
    embeddings, hundreds of megabytes): its state tensors are replaced, never written in place, when it starts."""
    shared: dict[int, object] = {}
    seen: set[int] = set()
    pending: list[object] = [drafter]
    while pending:
        obj = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, torch.nn.Module)):
            shared[id(obj)] = obj
        elif isinstance(obj, dict):
            pending += obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            pending += obj
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            pending += vars(obj).values()  # classes, modules and functions deepcopy keeps as they are
    return copy.deepcopy(drafter, shared)


def time_drafter(drafter: Drafter, committed: torch.Tensor, hidden: tuple[torch.Tensor, ...], budget: int,
                 repeats: int, warmup: int, absorbed: int = 1) -> dict:
    """One proposal of `drafter` (a `scratch_copy`) at `budget` after it absorbed the context `committed`
    (with the target's `hidden` states of it) and then `absorbed` more tokens, committed one a step and
    observed as after steps that accepted no draft, so that a feature drafter's proposal includes absorbing
    those tokens' target features. Each round starts the drafter afresh on the context (proposing once,
    untimed), so every timed proposal sees the same context."""
    last = tuple(h[-1:] for h in hidden)
    rng = seeded(0, committed.device)
    depth: list[int] = []
    tokens = [committed]

    def draft() -> DraftTree:
        return drafter.propose(DraftContext(tokens[0], budget, Sampling(), rng, FixedController(budget)))

    def propose() -> None:
        depth.append(max(draft().depths(), default=0))

    def restart() -> None:
        drafter.start(committed, hidden)
        tokens[0] = committed
        draft()
        for _ in range(absorbed):
            drafter.observe(StepOutcome(DraftTree(), [], int(tokens[0][-1]), [int(tokens[0][-1])], last))
            tokens[0] = torch.cat([tokens[0], tokens[0][-1:]])

    timing = _time_rounds([propose], repeats, warmup, committed.device, setup=restart)[0]
    return {"budget": budget, "absorbed": absorbed, "context": len(committed), "depth": float(np.mean(depth)),
            **timing}


def save_table(out_dir: str | Path, table: CostTable) -> Path:
    path = table_path(out_dir, table.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, table.as_json())
    return path


def measure_costs(model, strategies: list[Strategy], context: Callable[[], list[int]], out_dir: str | Path,
                  grid: Grid = Grid(), progress: Progress | None = None) -> CostTable:
    """The cost table for `model` and `strategies`: what is stored is reused, what is missing is timed
    and stored (atomically, after each group of entries, so an interruption keeps what was timed).
    `context` gives the token ids the drafters absorb; it is called only when a proposal is timed."""
    grid = grid.check().within(getattr(model.config, "max_position_embeddings", None))
    table = load_table(out_dir, table_key(model))
    groups = {(b, c): [(n, m) for m in grid.masks for n in grid.verify_lengths
                       if not (m == TREE and n < 2) and not table.has_target(b, n, c, m)]
              for b in grid.batch_sizes for c in grid.context_lens}
    groups = {k: v for k, v in groups.items() if v}
    overhead = [(b, n) for b in grid.batch_sizes for n in grid.verify_lengths if not table.has_overhead(b, n)]
    proposals = sum(map(len, missing_proposals(table, drafting(strategies), grid)))
    total = sum(map(len, groups.values())) + len(overhead) + proposals
    done = 0

    def advance(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(what, done, total)

    for (b, c), shapes in groups.items():
        with recorded_load(table.target):
            table.target.extend(time_targets(model, b, c, shapes, grid.repeats, grid.warmup))
        for _ in shapes:
            advance(f"target: batch {b}, context {c}")
        save_table(out_dir, table)
    with recorded_load(table.overhead):
        for b, n in overhead:
            table.overhead.append(time_overhead(model, b, n, grid.overhead_steps))
            advance(f"step overhead: batch {b}")
    if overhead:
        save_table(out_dir, table)
    time_drafters(table, model, strategies, context, out_dir, grid, advance)
    return table


def drafting(strategies: list[Strategy]) -> list[Strategy]:
    """The strategies with a drafter, one per drafter key (a combination's member and the member run alone
    share their proposals' entry)."""
    return list({drafter_key(s): s for s in strategies if s.drafter is not None}.values())


def missing_proposals(table: CostTable, strategies: list[Strategy], grid: Grid) -> list[list[tuple[int, int]]]:
    """Per strategy with a drafter, the proposals the table has no cost for, as (budget, tokens absorbed
    before it): each of the grid's budgets, and for a drafter with a network its backlogs at the first budget."""
    out = []
    for s in strategies:
        if s.drafter is None:
            continue
        wanted = [(b, 1) for b in grid.budgets]
        if s.drafter.model is not None:
            wanted += [(grid.budgets[0], n) for n in grid.backlogs]
        have = {(r["budget"], absorbed(r)) for r in table.drafters.get(drafter_key(s), [])}
        out.append([w for w in wanted if w not in have])
    return out


@torch.inference_mode()
def time_drafters(table: CostTable, model, strategies: list[Strategy], context: Callable[[], list[int]],
                  out_dir: str | Path, grid: Grid = BATCH_GRID,
                  advance: Callable[[str], None] = lambda what: None) -> CostTable:
    """Time the proposals `table` lacks (each drafter at each of the grid's budgets and backlogs) and store
    them; `context` is called once, and only when there is something to time."""
    with_drafter = drafting(strategies)
    missing = missing_proposals(table, with_drafter, grid)
    if not any(missing):
        return table
    committed = torch.tensor(context(), dtype=torch.long, device=model.device)
    for strategy, proposals in zip(with_drafter, missing):
        if not proposals:
            continue
        drafter = scratch_copy(strategy.drafter)
        hidden = prefill(model, committed, new_cache(model), drafter.hidden_layers)
        entries = table.drafters.setdefault(drafter_key(strategy), [])
        with recorded_load(entries):
            for budget, tokens in proposals:
                entries.append(time_drafter(drafter, committed, hidden, budget, grid.repeats, grid.warmup, tokens))
                advance(f"{strategy.name} proposals")
        save_table(out_dir, table)
    return table


def cost_strategies(target, drafter_dirs: list[str | Path], names: list[str] | None = None) -> list[Strategy]:
    """The strategies whose proposals a table times: `names`, or every drafter this target has (the
    model-free ones always, the trained ones where a known model keeps them or a --drafter gives them)."""
    specs = [parse_strategy(name) for name in names or DRAFTER_NAMES]
    sources = drafter_dirs_by_strategy(drafter_dirs, specs)
    if names is None:
        specs = [s for s in specs if definition(s.name).model_free or s.name in sources or target.name == DEFAULT_MODEL
                 or own_drafter(target, s.name)]
    return [build_strategy(spec, target, {}, sources) for spec in specs]


def drafter_context(target) -> list[int]:
    """The real text every drafter absorbs before its timed proposals: DRAFTER_CONTEXT tokens, or half
    the model's context where that is shorter. One length for all of a table's proposal costs, which
    grow with the context a feature drafter attends to, so that every entry prices the same thing."""
    limit = getattr(target.model.config, "max_position_embeddings", None)
    return real_context(target, DRAFTER_CONTEXT if limit is None else max(1, min(DRAFTER_CONTEXT, limit // 2)))


def real_context(target, length: int) -> list[int]:
    """`length` tokens of real text for the drafters' context: the default suite's first prompt and
    the target's own greedy answer (or the prompt repeated where there is no tokenizer)."""
    item = load_suite("default").items[0]
    prompt = encode_turn(target.tokenizer, item)
    answer = generate(target.model, prompt, max(0, length - len(prompt))).tokens
    return (prompt + answer)[:length]


def measure_target_costs(target, drafter_dirs: list[str | Path], out_dir: str | Path, grid: Grid = BATCH_GRID,
                         names: list[str] | None = None, progress: Progress | None = None) -> tuple[CostTable, Path]:
    """`specbench costs`: the cost table of a loaded target and its drafters, and where it is stored."""
    grid.check(getattr(target.model.config, "max_position_embeddings", None))
    strategies = cost_strategies(target, drafter_dirs, names)
    table = measure_costs(target.model, strategies, partial(drafter_context, target), out_dir, grid, progress)
    return table, table_path(out_dir, table.key)
