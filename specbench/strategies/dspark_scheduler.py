"""DSpark's draft-length scheduler (source article 2), a controller usable with any drafter.

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
from typing import TYPE_CHECKING, Any

from specbench.errors import SpecbenchError
from specbench.strategies.space import Choice, FloatRange, IntRange, Param, Ref, SearchSpace, When, check_ranges, knob

if TYPE_CHECKING:  # annotations only: controller names are read before torch is imported
    import torch

MAX_STEP = 2  # the article's bound on how far K moves per evaluation

_KNOBS = {  # name: (default, description, unit, valid low, valid high); the article's values are the defaults
    "window_size": (64, "scheduler: verifications in the acceptance-rate window", "verifications", 1, None),
    "adjust_interval": (16, "scheduler: committed tokens between evaluations", "tokens", 1, None),
    "k_min": (2, "scheduler: least verify length K (the last token + drafts)", "positions", 2, None),
    "k_max": (8, "scheduler: largest verify length K, >= k_min", "positions", 2, None),
    "hysteresis": (True, "scheduler: a change needs two consecutive agreeing evaluations", "", None, None),
    "grow_above": (0.6, "scheduler: acceptance rate above which K grows, >= shrink_below", "rate", 0, 1),
    "shrink_below": (0.3, "scheduler: acceptance rate below which K shrinks", "rate", 0, 1),
}


def scheduler_knob(name: str) -> Any:
    """The dataclass field of scheduler knob `name`, for the scheduler and for a drafter's options."""
    default, description, unit, low, high = _KNOBS[name]
    return knob(default, description, unit, low, high)


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
class DSparkScheduler:
    k: int  # the verify length now
    window_size: int = scheduler_knob("window_size")
    adjust_interval: int = scheduler_knob("adjust_interval")
    k_min: int = scheduler_knob("k_min")
    k_max: int = scheduler_knob("k_max")
    hysteresis: bool = scheduler_knob("hysteresis")
    grow_above: float = scheduler_knob("grow_above")
    shrink_below: float = scheduler_knob("shrink_below")
    history: deque = field(init=False, repr=False)  # (drafted, accepted) of the last window_size verifications
    pending: int = field(init=False, default=0)  # tokens committed since the last evaluation
    vote: int = field(init=False, default=0)  # the last evaluation's direction, for hysteresis

    def __post_init__(self) -> None:
        check_knobs(self)
        self.k = min(max(self.k, self.k_min), self.k_max)
        self.history = deque(maxlen=self.window_size)

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


def check_knobs(knobs: Any, prefix: str = "") -> None:
    """Validate scheduler knobs (of a DSparkScheduler or a strategy's options), naming the bad one."""
    check_ranges(knobs, prefix)
    if knobs.k_max < knobs.k_min:
        raise SpecbenchError(f"{prefix}k_max ({knobs.k_max}) must be at least {prefix}k_min ({knobs.k_min})")
    if not knobs.shrink_below <= knobs.grow_above:
        raise SpecbenchError(f"{prefix}grow_above ({knobs.grow_above}) must be at least "
                             f"{prefix}shrink_below ({knobs.shrink_below})")


KNOBS = tuple(_KNOBS)


def from_options(budget: int, options: Any) -> DSparkScheduler:
    """`--controller dspark` for any drafter: the knobs `options` has, the defaults for the rest; K = budget + 1."""
    return DSparkScheduler(budget + 1, **{name: getattr(options, name) for name in KNOBS if hasattr(options, name)})
