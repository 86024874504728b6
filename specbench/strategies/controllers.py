"""Controllers: how many positions to draft each step, learnt from verification outcomes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FixedController:
    """Always draft k positions."""

    k: int

    def budget(self) -> int:
        return self.k

    def keep_drafting(self, depth: int, logits: torch.Tensor) -> bool:
        return True

    def update(self, drafted: int, accepted: int) -> None:
        pass


@dataclass
class HeuristicController(FixedController):
    """transformers' assistant heuristic: k += 2 when every draft token was accepted, else k - 1 (min 1)."""

    def update(self, drafted: int, accepted: int) -> None:
        if drafted and accepted == drafted:
            self.k += 2
        else:
            self.k = max(1, self.k - 1)
