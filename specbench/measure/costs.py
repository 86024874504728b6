"""Measured forward costs: what one target verify forward and one drafter proposal take on this device.

The target is timed at batch B x verify length n x context c (a KV cache of c positions, then n new
tokens, with a chain's causal mask or a tree mask), and each drafter's `propose` at each draft
budget, on a real context. Each entry is the median of repeats after a warm-up, with its spread
(interquartile range over the median). A table is stored under results/costs/ keyed by model,
device, dtype and torch version; drafters are keyed inside it by strategy, knobs and weights, and
entries already measured are reused instead of timed again.

The cost model (measure/stats.py) predicts a strategy's speedup from these costs and the tau and
draft shape a run measured, never from the strategy's own step times.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specbench.engine.decode import forward, prefill
from specbench.engine.kv_cache import new_cache, truncate
from specbench.engine.protocol import DraftContext
from specbench.engine.sampling import Sampling, seeded
from specbench.engine.tree import DraftTree
from specbench.measure.cost_table import CHAIN, TREE, CostTable, load_table, table_path
from specbench.measure.host import cpu_name
from specbench.models import fingerprint
from specbench.results import write_json
from specbench.strategies.build import Strategy
from specbench.strategies.controllers import FixedController

Progress = Callable[[str, int, int], None]  # what, done, total

TREE_WIDTH = 4  # the test trees are complete 4-ary trees: the mask's shape, not its content, sets the cost


@dataclass(frozen=True)
class Grid:
    """What to time: target shapes and drafter budgets."""

    batch_sizes: tuple[int, ...] = (1,)
    verify_lengths: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 49)
    context_lens: tuple[int, ...] = (64, 256)
    masks: tuple[str, ...] = (CHAIN, TREE)
    budgets: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    repeats: int = 7
    warmup: int = 2


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def table_key(model: torch.nn.Module) -> dict[str, str]:
    device = model.device
    return {"model": fingerprint(model), "device": device_name(device),
            "dtype": str(model.dtype).removeprefix("torch."), "torch": torch.__version__,
            "threads": str(torch.get_num_threads()) if device.type == "cpu" else "-"}


def drafter_key(strategy: Strategy) -> str:
    """Strategy name, each member's knobs and a digest of its weights: what the cost of a proposal depends on."""
    members = getattr(strategy.drafter, "members", [strategy.drafter])
    digest = hashlib.sha256(strategy.name.encode())
    for member in members:
        digest.update(repr(getattr(member, "options", None)).encode())
        model = getattr(member, "model", None)
        for p in model.parameters() if isinstance(model, torch.nn.Module) else ():
            digest.update(p.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return f"{strategy.name}:{digest.hexdigest()[:12]}"


def _time(fn: Callable[[], None], repeats: int, warmup: int, device: torch.device) -> tuple[float, float]:
    """Median seconds of `fn` over `repeats` runs after `warmup`, and the spread (IQR / median)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return float(median), float((q3 - q1) / median) if median > 0 else 0.0


def complete_tree(nodes: int, width: int = TREE_WIDTH) -> DraftTree:
    """`nodes` nodes filled breadth first, `width` children each."""
    tree = DraftTree()
    for i in range(nodes):
        tree.add(0, (i // width) - 1 if i >= width else -1, "cost")
    return tree


@torch.inference_mode()
def time_target(model, batch: int, tokens: int, context: int, mask: str, repeats: int, warmup: int) -> dict:
    """One verify forward of `tokens` positions over a cache of `context` positions (trees at batch 1)."""
    device = model.device
    cache = new_cache(model.config)
    ids = torch.randint(model.config.vocab_size, (batch, context + tokens), device=device)
    if context:
        model(input_ids=ids[:, :context], cache=cache, use_cache=True)
    tree = complete_tree(tokens - 1) if mask == TREE else None

    def verify() -> None:
        if tree is not None:
            forward(model, ids[0, context:], cache, tree, ())
        else:
            model(input_ids=ids[:, context:], cache=cache, use_cache=True)
        truncate(cache, context)

    median, spread = _time(verify, repeats, warmup, device)
    return {"batch": batch, "tokens": tokens, "context": context, "mask": mask, "median_s": median, "spread": spread}


@torch.inference_mode()
def time_drafter(model, strategy: Strategy, context_ids: list[int], budget: int, repeats: int, warmup: int) -> dict:
    """One proposal at `budget` after the drafter absorbed `context_ids` (its first proposal is unmeasured)."""
    drafter = strategy.drafter
    committed = torch.tensor(context_ids, dtype=torch.long, device=model.device)
    drafter.start(committed, prefill(model, committed, new_cache(model.config), drafter.hidden_layers))
    rng = seeded(0, model.device)
    depth: list[int] = []

    def propose() -> None:
        tree = drafter.propose(DraftContext(committed, budget, Sampling(), rng, FixedController(budget)))
        depth.append(max(tree.depths(), default=0))

    median, spread = _time(propose, repeats, warmup, model.device)
    return {"budget": budget, "depth": float(np.mean(depth)), "median_s": median, "spread": spread}


def measure_costs(model, strategies: list[Strategy], context_ids: list[int], out_dir: str | Path,
                  grid: Grid = Grid(), progress: Progress | None = None) -> CostTable:
    """The cost table for `model` and `strategies`: what is stored is reused, what is missing is timed
    (and stored, atomically)."""
    table = load_table(out_dir, table_key(model))
    todo_target = [(b, n, c, m) for b in grid.batch_sizes for c in grid.context_lens for m in grid.masks
                   for n in grid.verify_lengths
                   if not (m == TREE and (b > 1 or n < 2)) and not table.has_target(b, n, c, m)]
    todo_drafters = [s for s in strategies if s.drafter is not None and drafter_key(s) not in table.drafters]
    total, done = len(todo_target) + len(todo_drafters) * len(grid.budgets), 0
    for b, n, c, m in todo_target:
        table.target.append(time_target(model, b, n, c, m, grid.repeats, grid.warmup))
        done += 1
        if progress:
            progress("target forwards", done, total)
    for strategy in todo_drafters:
        rows = []
        for budget in grid.budgets:
            rows.append(time_drafter(model, strategy, context_ids, budget, grid.repeats, grid.warmup))
            done += 1
            if progress:
                progress(f"{strategy.name} proposals", done, total)
        table.drafters[drafter_key(strategy)] = rows
    if todo_target or todo_drafters:
        path = table_path(out_dir, table.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, table.as_json())
    return table
