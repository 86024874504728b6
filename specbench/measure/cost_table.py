"""A measured forward-cost table (see measure/costs.py for how it is timed): the data, its
interpolation, and where it is stored. Torch-free, so reports and the cost model can read it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CHAIN, TREE = "chain", "tree"


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
