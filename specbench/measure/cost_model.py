"""Predicted tokens per step and speedup from per-position acceptance and per-step costs.

Leviathan et al. (arXiv 2211.17192, section 3): with a_k = P(draft position k accepted | every
position before it accepted), the expected tokens committed per target step, the bonus token
included, is tau = 1 + sum_k prod_{i<=k} a_i (with a constant a over gamma positions this is
(1 - a^(gamma+1)) / (1 - a)). Dividing by the step's cost in units of one plain `ar` step gives
the predicted speedup, printed next to the measured one so a gap between them is visible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specbench.errors import SpecbenchError


def predict(
    accept_by_position: Sequence[float],
    draft_ratio: float,
    verify_ratio: float,
    other_ratio: float = 0.0,
) -> dict[str, float]:
    """Predicted tau and speedup.

    accept_by_position: conditional acceptance a_k per draft position, each in [0, 1].
    draft_ratio, verify_ratio, other_ratio: a step's drafting, verification and remaining time,
    each relative to the time of one `ar` step (one target forward of one token).
    """
    for k, a in enumerate(accept_by_position, start=1):
        if not 0.0 <= a <= 1.0:
            raise SpecbenchError(f"acceptance at draft position {k} must be in [0, 1], got {a!r}")
    ratios = {"draft_ratio": draft_ratio, "verify_ratio": verify_ratio, "other_ratio": other_ratio}
    for name, value in ratios.items():
        if not (math.isfinite(value) and value >= 0.0):
            raise SpecbenchError(f"cost model {name} must be a finite number >= 0, got {value!r}")
    cost = draft_ratio + verify_ratio + other_ratio
    if cost <= 0.0:
        raise SpecbenchError("cost model needs a step cost > 0 (draft + verify + other ratios are all 0)")
    tau, reach = 1.0, 1.0
    for a in accept_by_position:
        reach *= a
        tau += reach
    return {"predicted_tau": tau, "predicted_speedup": tau / cost}
