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
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from specbench.errors import SpecbenchError

if TYPE_CHECKING:  # annotations only: controller names are read before torch is imported
    import torch

MAX_STEP = 2  # the article's bound on how far K moves per evaluation


@dataclass
class DSparkScheduler:
    k: int  # the verify length now
    window_size: int = 64
    adjust_interval: int = 16
    k_min: int = 2
    k_max: int = 8
    hysteresis: bool = True
    grow_above: float = 0.6
    shrink_below: float = 0.3
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
    """Validate scheduler knobs (from a DSparkScheduler or a strategy's options), naming the bad one."""
    if knobs.k_min < 2:
        raise SpecbenchError(f"{prefix}k_min must be at least 2 (K counts the last committed token and at least "
                             f"one draft), got {knobs.k_min}")
    if knobs.k_max < knobs.k_min:
        raise SpecbenchError(f"{prefix}k_max ({knobs.k_max}) must be at least {prefix}k_min ({knobs.k_min})")
    if knobs.window_size < 1:
        raise SpecbenchError(f"{prefix}window_size must be at least 1, got {knobs.window_size}")
    if knobs.adjust_interval < 1:
        raise SpecbenchError(f"{prefix}adjust_interval must be at least 1, got {knobs.adjust_interval}")
    if not 0.0 <= knobs.shrink_below <= 1.0:
        raise SpecbenchError(f"{prefix}shrink_below must be within [0, 1], got {knobs.shrink_below}")
    if not knobs.shrink_below <= knobs.grow_above <= 1.0:
        raise SpecbenchError(f"{prefix}grow_above ({knobs.grow_above}) must be within "
                             f"[{prefix}shrink_below ({knobs.shrink_below}), 1]")


KNOBS = tuple(f.name for f in fields(DSparkScheduler) if f.init and f.name != "k")


def from_options(budget: int, options: Any) -> DSparkScheduler:
    """`--controller dspark` for any drafter: the knobs `options` has, the defaults for the rest; K = budget + 1."""
    return DSparkScheduler(budget + 1, **{name: getattr(options, name) for name in KNOBS if hasattr(options, name)})
