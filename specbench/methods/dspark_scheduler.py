"""DSpark's draft-length scheduler (the DFlash-to-DSpark practitioners' write-up), a controller usable with any drafter.

K is the verify length: the last committed token plus the drafts, so the draft budget is K - 1.
Every `adjust_interval` committed tokens (accepted drafts + the bonus token, counted per
verification) the scheduler evaluates the acceptance rate over the last `window_size`
verifications, accepted drafts / drafted positions, and votes:

- rate > grow_above -> grow K by 2,
- rate < shrink_below -> shrink K by 2,
- otherwise (or with nothing drafted in the window) -> hold,

always within [k_min, k_max], so K moves by at most 2 per evaluation. With `hysteresis` a vote
only changes K when the previous evaluation voted the same way, and a change resets the vote, so
every change needs two consecutive agreeing evaluations. The acceptance rate of a chain falls as it
grows even at a constant per-token acceptance a (rate = a(1 - a^d) / ((1 - a) d) for d drafts), so
the band between the marks is where K settles. From K = 8 with the defaults: a = 0.8 holds K at 8
(rate 0.45), a = 0.6 settles at K = 4 (rate 0.39), a = 0.4 at K = 2 (rate 0.4).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specbench.core.errors import SpecbenchError
from specbench.methods.search_space import (
    Choice,
    FloatRange,
    IntRange,
    Param,
    Ref,
    SearchSpace,
    When,
    check_ranges,
    knob,
)

if TYPE_CHECKING:  # annotations only: controller names are read before torch is imported
    import torch

MAX_STEP = 2  # the article's bound on how far K moves per evaluation


@dataclass(kw_only=True)
class SchedulerKnobs:
    """The scheduler's knobs, the article's values as defaults. A strategy whose knob dataclass subclasses
    this one (dspark's) lets a user set them as its own: `--set dspark.window_size=32`."""

    window_size: int = knob(64, "scheduler: verifications in the acceptance-rate window", "verifications", low=1)
    adjust_interval: int = knob(16, "scheduler: committed tokens between evaluations", "tokens", low=1)
    k_min: int = knob(2, "scheduler: least verify length K (the last token + drafts)", "positions", low=2)
    k_max: int = knob(8, "scheduler: largest verify length K, >= k_min", "positions", low=2)
    hysteresis: bool = knob(True, "scheduler: a change needs two consecutive agreeing evaluations")
    grow_above: float = knob(0.6, "scheduler: acceptance rate above which K grows, >= shrink_below", "rate",
                             low=0, high=1)
    shrink_below: float = knob(0.3, "scheduler: acceptance rate below which K shrinks", "rate", low=0, high=1)

    def __post_init__(self) -> None:
        self.check()

    def check(self, prefix: str = "") -> None:
        """Refuse the first invalid knob, naming it (`prefix`: the strategy's, e.g. "dspark.")."""
        check_ranges(self, prefix)
        if self.k_max < self.k_min:
            raise SpecbenchError(f"{prefix}k_max ({self.k_max}) must be at least {prefix}k_min ({self.k_min})")
        if not self.shrink_below <= self.grow_above:
            raise SpecbenchError(f"{prefix}grow_above ({self.grow_above}) must be at least "
                                 f"{prefix}shrink_below ({self.shrink_below})")


# searched only when the scheduler is the controller; around the article's values (N = 64, every 16
# tokens, K in [2, 8]), with k_max sampled from [k_min, 8] and grow_above above shrink_below so that
# every sampled point is valid
SCHEDULED = When("controller", ("dspark",))
SCHEDULER_SPACE = SearchSpace((
    Param("window_size", IntRange(16, 256, log=True), SCHEDULED),
    Param("adjust_interval", IntRange(4, 64, log=True), SCHEDULED),
    Param("k_min", IntRange(2, 8), SCHEDULED),
    Param("k_max", IntRange(Ref("k_min"), 8), SCHEDULED),
    Param("hysteresis", Choice((True, False)), SCHEDULED),
    Param("shrink_below", FloatRange(0.05, 0.5), SCHEDULED),
    Param("grow_above", FloatRange(Ref("shrink_below", 0.05), 0.95), SCHEDULED),
))


@dataclass
class DSparkScheduler(SchedulerKnobs):
    k: int  # the verify length now
    history: deque = field(init=False, repr=False)  # (drafted, accepted) of the last window_size verifications
    pending: int = field(init=False, default=0)  # tokens committed since the last evaluation
    vote: int = field(init=False, default=0)  # the last evaluation's direction, for hysteresis

    def __post_init__(self) -> None:
        self.check()
        self.k = min(max(self.k, self.k_min), self.k_max)
        self.history = deque(maxlen=self.window_size)

    @classmethod
    def start(cls, budget: int, knobs: SchedulerKnobs) -> DSparkScheduler:
        """A scheduler for a strategy whose starting draft depth is `budget`: K = budget + 1."""
        return cls(budget + 1, **vars(knobs))

    def budget(self) -> int:
        return self.k - 1

    def keep_drafting(self, depth: int, logits: torch.Tensor) -> bool:
        return True

    def update(self, drafted: int, accepted: int) -> None:
        self.history.append((drafted, accepted))
        self.pending += accepted + 1
        if self.pending >= self.adjust_interval:
            self.pending %= self.adjust_interval
            self._evaluate()

    def acceptance_rate(self) -> float | None:
        """Accepted / drafted over the window; None when nothing was drafted in it."""
        drafted = sum(d for d, _ in self.history)
        return sum(a for _, a in self.history) / drafted if drafted else None

    def _evaluate(self) -> None:
        rate = self.acceptance_rate()
        direction = 0 if rate is None else int(rate > self.grow_above) - int(rate < self.shrink_below)
        if direction and (not self.hysteresis or self.vote == direction):
            self.k = min(max(self.k + MAX_STEP * direction, self.k_min), self.k_max)
            self.vote = 0
        else:
            self.vote = direction
