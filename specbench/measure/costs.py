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
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specbench.engine.decode import forward, prefill
from specbench.engine.kv_cache import new_cache, truncate
from specbench.engine.protocol import DraftContext
from specbench.engine.sampling import Sampling, seeded
from specbench.engine.tree import DraftTree
from specbench.measure.host import cpu_name
from specbench.models import fingerprint
from specbench.results import write_json
from specbench.strategies.build import Strategy
from specbench.strategies.controllers import FixedController

Progress = Callable[[str, int, int], None]  # what, done, total

CHAIN, TREE = "chain", "tree"
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


def _interpolate(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear in x, extended linearly past the last two points (costs keep growing)."""
    if len(xs) == 1:
        return ys[0]
    if x > xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (x - xs[-1])
    return float(np.interp(x, xs, ys))


@dataclass
class CostTable:
    key: dict[str, str]
    target: list[dict] = field(default_factory=list)
    drafters: dict[str, list[dict]] = field(default_factory=dict)  # drafter key -> rows

    def _target_rows(self, batch: int, mask: str) -> list[dict]:
        rows = [r for r in self.target if r["batch"] == batch and r["mask"] == mask]
        if not rows:
            raise KeyError(f"no {mask} target costs at batch {batch}")
        return rows

    def target_s(self, tokens: float, context: float, batch: int = 1, tree: bool = False) -> float:
        """Seconds of one verify forward of `tokens` positions at `context`, interpolated over the grid."""
        rows = self._target_rows(batch, TREE if tree and tokens > 1 else CHAIN)
        contexts = sorted({r["context"] for r in rows})
        at_context = []
        for c in contexts:
            line = sorted((r["tokens"], r["median_s"]) for r in rows if r["context"] == c)
            at_context.append(_interpolate(tokens, [t for t, _ in line], [s for _, s in line]))
        return _interpolate(context, contexts, at_context)

    def drafter_s(self, key: str, budget: float) -> float:
        """Seconds of one proposal at draft budget `budget`, interpolated over the measured budgets."""
        line = sorted((r["budget"], r["median_s"]) for r in self.drafters[key])
        return _interpolate(budget, [b for b, _ in line], [s for _, s in line])

    def has_target(self, batch: int, tokens: int, context: int, mask: str) -> bool:
        return any((r["batch"], r["tokens"], r["context"], r["mask"]) == (batch, tokens, context, mask)
                   for r in self.target)

    def as_json(self) -> dict:
        return {"key": self.key, "target": self.target, "drafters": self.drafters}


def table_path(out_dir: str | Path, key: dict[str, str]) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(out_dir) / "costs" / f"{name}.json"


def load_table(out_dir: str | Path, key: dict[str, str]) -> CostTable:
    path = table_path(out_dir, key)
    if not path.is_file():
        return CostTable(key)
    try:
        data = json.loads(path.read_text())
        return CostTable(key, list(data["target"]), {k: list(v) for k, v in data["drafters"].items()})
    except (OSError, ValueError, KeyError, TypeError):
        return CostTable(key)  # a damaged table is measured again, not trusted


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
