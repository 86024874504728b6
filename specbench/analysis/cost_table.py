"""A measured forward-cost table (see bench/cost_timing.py for how it is timed): the data, its
interpolation, and where it is stored. Torch-free, so reports and the cost model can read it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json
from specbench.core.ranges import check_ranges, check_sizes

CHAIN, TREE = "chain", "tree"
MAX_SPREAD = 0.25  # interquartile range over median of an entry's repeats
MAX_OTHERS = 0.15  # share of the CPUs other processes took while an entry was timed (counters tick at 10 ms)


def trusted(entry: dict) -> bool:
    """Whether a stored entry was timed on a quiet machine: consistent repeats and little other load
    (`others_cpu` null: timed too briefly to tell; an entry that does not say at all is not trusted).
    Untrusted entries are timed again rather than reused, so one noisy session cannot bias every
    later cost model."""
    others = entry.get("others_cpu", 1.0)
    return entry.get("spread", 1.0) <= MAX_SPREAD and (others is None or others <= MAX_OTHERS)


def absorbed(entry: dict) -> int:
    """The committed tokens a drafter absorbed before the timed proposal of a drafter entry."""
    return entry.get("absorbed", 1)


def _interpolate(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear in x, extended linearly past the last two points (costs keep growing)."""
    if len(xs) == 1:
        return ys[0]
    if x > xs[-1]:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))  # noise must not make a cost fall
        return ys[-1] + slope * (x - xs[-1])
    return float(np.interp(x, xs, ys))


@dataclass
class CostTable:
    key: dict[str, str]
    target: list[dict] = field(default_factory=list)
    drafters: dict[str, list[dict]] = field(default_factory=dict)  # drafter key -> rows
    overhead: list[dict] = field(default_factory=list)  # the batched engine's step overhead by batch and block

    def _target_rows(self, batch: int, mask: str) -> list[dict]:
        rows = [r for r in self.target if r["batch"] == batch and r["mask"] == mask]
        if not rows:
            raise KeyError(f"no {mask} target costs at batch {batch}")
        return rows

    def batch_sizes(self) -> list[int]:
        return sorted({r["batch"] for r in self.target})

    def target_s(self, tokens: float, context: float, batch: float = 1, tree: bool = False) -> float:
        """Seconds of one verify forward of `tokens` positions at `context`, interpolated over the grid
        (between the measured batch sizes too: a batch that sequences leave runs at every size below its own)."""
        mask = TREE if tree and tokens > 1 else CHAIN
        sizes = sorted({r["batch"] for r in self.target if r["mask"] == mask})
        if batch not in sizes and sizes:  # below the smallest measured batch size: its cost
            return _interpolate(batch, sizes, [self.target_s(tokens, context, b, tree) for b in sizes])
        rows = self._target_rows(int(batch), mask)
        contexts = sorted({r["context"] for r in rows})
        at_context = []
        for c in contexts:
            line = sorted((r["tokens"], r["median_s"]) for r in rows if r["context"] == c)
            at_context.append(_interpolate(tokens, [t for t, _ in line], [s for _, s in line]))
        return _interpolate(context, contexts, at_context)

    def drafter_s(self, key: str, budget: float) -> float:
        """Seconds of one proposal at draft budget `budget` (one committed token absorbed before it),
        interpolated over the measured budgets."""
        # a budget timed again reads its latest timing
        line = sorted({r["budget"]: r["median_s"] for r in self.drafters[key] if absorbed(r) == 1}.items())
        return _interpolate(budget, [b for b, _ in line], [s for _, s in line])

    def catch_up_s(self, key: str, tokens: float) -> float:
        """Seconds a proposal takes more where the drafter absorbs `tokens` committed tokens first rather than
        one (a drafter that drafted none of the last steps catches up on them), interpolated over the measured
        backlogs; 0 where none was measured (a model-free drafter)."""
        backlog = [r for r in self.drafters.get(key, []) if absorbed(r) > 1]
        if not backlog or tokens <= 1:
            return 0.0
        budget = backlog[0]["budget"]
        line = sorted({absorbed(r): r["median_s"] for r in self.drafters[key] if r["budget"] == budget}.items())
        return max(0.0, _interpolate(tokens, [t for t, _ in line], [s for _, s in line]) - line[0][1])

    def overhead_s(self, tokens: float, batch: float) -> float:
        """The batched engine's step overhead at `batch` rows and a verify block of `tokens` (interpolated
        between measured batch sizes); 0 where the table has none (a table measured before it was recorded)."""
        sizes = sorted({r["batch"] for r in self.overhead})
        if batch not in sizes and sizes:
            return _interpolate(batch, sizes, [self.overhead_s(tokens, b) for b in sizes])
        line = sorted((r["tokens"], r["median_s"]) for r in self.overhead if r["batch"] == batch)
        return _interpolate(tokens, [t for t, _ in line], [s for _, s in line]) if line else 0.0

    def has_target(self, batch: int, tokens: int, context: int, mask: str) -> bool:
        return any((r["batch"], r["tokens"], r["context"], r["mask"]) == (batch, tokens, context, mask)
                   for r in self.target)

    def has_overhead(self, batch: int, tokens: int) -> bool:
        return any((r["batch"], r["tokens"]) == (batch, tokens) for r in self.overhead)

    def as_json(self) -> dict:
        return {"key": self.key, "target": self.target, "drafters": self.drafters, "overhead": self.overhead}


def table_path(out_dir: str | Path, key: dict[str, str]) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(out_dir) / "costs" / f"{name}.json"


def load_table(out_dir: str | Path, key: dict[str, str]) -> CostTable:
    path = table_path(out_dir, key)
    if not path.is_file():
        return CostTable(key)
    try:
        data = read_json(path, "cost table")
        drafters = {k: [r for r in v if trusted(r)] for k, v in data["drafters"].items()}
        return CostTable(key, [r for r in data["target"] if trusted(r)], {k: v for k, v in drafters.items() if v},
                         [r for r in data.get("overhead", []) if trusted(r)])
    except (SpecbenchError, ValueError, KeyError, TypeError):
        return CostTable(key)  # a damaged table is measured again, not trusted


@dataclass(frozen=True)
class Grid:
    """What to time: target shapes and drafter budgets."""

    batch_sizes: tuple[int, ...] = (1,)
    verify_lengths: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 49)
    context_lens: tuple[int, ...] = (64, 256)
    masks: tuple[str, ...] = (CHAIN, TREE)
    budgets: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    # committed tokens a drafter with a network absorbs before a proposal at the first budget, beside the one
    # a proposal per step absorbs: a combination's member that sat out steps catches up on their tokens
    backlogs: tuple[int, ...] = (16, 64)
    repeats: int = 7
    warmup: int = 2
    overhead_steps: int = 3  # batched decode steps timed for the step overhead at each batch and block length

    def check(self, max_positions: int | None = None) -> Grid:
        """Bad input as one clear line: empty or unsorted lists, sizes below 1, contexts beyond the model."""
        check_sizes(self.batch_sizes, "--batch-sizes")
        check_sizes(self.verify_lengths, "--verify-lengths")
        check_sizes(self.context_lens, "--context-lens", low=0)
        check_sizes(self.budgets, "draft budgets")
        if max_positions is not None and self.context_lens[-1] + self.verify_lengths[-1] > max_positions:
            raise SpecbenchError(f"--context-lens {self.context_lens[-1]} plus a verify length of "
                                 f"{self.verify_lengths[-1]} is beyond the model's maximum of {max_positions} "
                                 "positions")
        check_ranges({"--repeats": self.repeats, "--warmup": self.warmup})
        return self

    def within(self, max_positions: int | None) -> Grid:
        """This grid with contexts too long for the model replaced by the longest that fits (for a
        default grid: a user's own contexts are checked, not changed)."""
        if max_positions is None:
            return self
        room = max(0, max_positions - self.verify_lengths[-1])
        return replace(self, context_lens=tuple(sorted({min(c, room) for c in self.context_lens})))


# `specbench costs`' default: the load axis, about two minutes on 2 CPU cores for the embedded model
BATCH_GRID = Grid(batch_sizes=(1, 2, 4, 8, 16, 32), verify_lengths=(1, 2, 4, 8, 16), context_lens=(128, 1024),
                  budgets=(1, 3, 7, 15), repeats=5, warmup=1)
