"""Controllers: how many positions to draft each step, learnt from verification outcomes.

`CONTROLLERS` is the one registry `--controller` names: each entry says what the controller does, its
knob dataclass (if it has knobs) and how to start one. A controller's knobs are set by the strategy's
knobs of the same names (dspark's options subclass the scheduler's knobs; mtp has entropy_threshold),
the defaults elsewhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from specbench.methods.dspark_scheduler import DSparkScheduler, SchedulerKnobs
from specbench.methods.search_space import check_ranges, knob

if TYPE_CHECKING:  # annotations only: controller names are read before torch is imported
    import torch

    from specbench.decoding.drafting import Controller

ENTROPY_THRESHOLD = 2.1  # nats; the EAGLE/MTP/DFlash/DSpark practitioners' comparison's value


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

    threshold: float = ENTROPY_THRESHOLD

    def keep_drafting(self, depth: int, logits: torch.Tensor) -> bool:
        return float(entropy(logits)) <= self.threshold


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) over the last dimension; a token at -inf logit (outside a draft
    vocabulary) adds 0, not 0 * -inf."""
    p = logits.float().softmax(-1)
    return -p.xlogy(p).sum(-1)


@dataclass
class CappedController:
    """Another controller, drafting at most `cap` positions a step (a run's per-batch-size draft schedule)."""

    inner: Any
    cap: int

    def budget(self) -> int:
        return min(self.inner.budget(), self.cap)

    def keep_drafting(self, depth: int, logits: torch.Tensor) -> bool:
        return self.inner.keep_drafting(depth, logits)

    def update(self, drafted: int, accepted: int) -> None:
        self.inner.update(drafted, accepted)


@dataclass(kw_only=True)
class EntropyKnobs:
    entropy_threshold: float = knob(ENTROPY_THRESHOLD, "entropy controller: stop drafting where the draft "
                                                       "entropy exceeds it", "nats", low=0)

    def __post_init__(self) -> None:
        check_ranges(self, "")


@dataclass(frozen=True)
class ControllerDef:
    """A controller as `--controller` names it."""

    description: str  # what it does, for `specbench strategies`
    new: Callable[[int, Any], Controller]  # (the strategy's starting draft depth, its knobs or None) -> a controller
    knobs: type | None = None  # its knob dataclass

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.knobs)) if self.knobs else ()

    def __call__(self, budget: int, options: Any) -> Controller:
        """A fresh controller for a strategy with knob dataclass `options`, starting at `budget` drafts:
        its knobs from the strategy's knobs of the same names, the defaults for the rest."""
        if self.knobs is None:
            return self.new(budget, None)
        values = {name: getattr(options, name) for name in self.knob_names if hasattr(options, name)}
        return self.new(budget, self.knobs(**values))


CONTROLLERS: dict[str, ControllerDef] = {
    "fixed": ControllerDef("always draft the strategy's starting depth", lambda k, _: FixedController(k)),
    "heuristic": ControllerDef("transformers' assistant rule: +2 when every draft was accepted, else -1",
                               lambda k, _: HeuristicController(k)),
    "entropy": ControllerDef(f"stop drafting where the draft entropy exceeds a threshold (AdaEDL's rule; "
                             f"{ENTROPY_THRESHOLD} nats unless the strategy has entropy_threshold)",
                             lambda k, knobs: EntropyController(k, knobs.entropy_threshold), EntropyKnobs),
    "dspark": ControllerDef("DSpark's scheduler: the verify length K follows the acceptance rate over a window, "
                            "within [k_min, k_max]", DSparkScheduler.start, SchedulerKnobs),
}
