"""Controllers: how many positions to draft each step, learnt from verification outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from specbench.strategies.dspark_scheduler import KNOBS as DSPARK_KNOBS
from specbench.strategies.dspark_scheduler import from_options as dspark_scheduler

if TYPE_CHECKING:  # annotations only: controller names are read before torch is imported
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


@dataclass
class EntropyController(FixedController):
    """Draft up to k positions, stopping where the draft distribution's entropy exceeds a threshold.

    AdaEDL (arXiv 2410.18351) is the published form of this early-stopping rule.
    """

    threshold: float = 2.1  # nats; source article 1's value

    def keep_drafting(self, depth: int, logits: torch.Tensor) -> bool:
        return entropy(logits) <= self.threshold


def entropy(logits: torch.Tensor) -> float:
    """Entropy in nats of softmax(logits) over the last dimension."""
    logp = logits.float().log_softmax(-1)
    return float(-(logp.exp() * logp).sum(-1))


# name -> factory(starting depth, the strategy's knob dataclass)
CONTROLLERS: dict[str, Callable[[int, Any], Any]] = {
    "fixed": lambda k, options: FixedController(k),
    "heuristic": lambda k, options: HeuristicController(k),
    "entropy": lambda k, options: EntropyController(k, getattr(options, "entropy_threshold", 2.1)),
    "dspark": dspark_scheduler,
}

# name -> (what it does, the strategy knobs it reads where the strategy has them), for `specbench strategies`
CONTROLLER_HELP: dict[str, tuple[str, tuple[str, ...]]] = {
    "fixed": ("always draft the strategy's starting depth", ()),
    "heuristic": ("transformers' assistant rule: +2 when every draft was accepted, else -1", ()),
    "entropy": ("stop drafting where the draft entropy exceeds a threshold (AdaEDL's rule; 2.1 nats "
                "unless the strategy has entropy_threshold)", ("entropy_threshold",)),
    "dspark": ("DSpark's scheduler: the verify length K follows the acceptance rate over a window, within "
               "[k_min, k_max]", DSPARK_KNOBS),
}
