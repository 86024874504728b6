"""The cost model: a strategy's speedup predicted from the shape a run measured and forward costs timed
separately (bench/cost_timing.py), never from the strategy's own step times.

Taken from the run: tau (tokens per target forward, bonus included), the mean verify length, the
mean draft budget, whether the verify forwards used a tree mask, and the mean context. Taken from
the cost table: the target's forward at that verify length and context, one plain (1-token)
forward at that context, and the drafter's proposal at that budget. Then

    predicted speedup = tau * T_target(1) / (T_draft(budget) + T_target(verified))

Left out, on purpose: prefill, the acceptance rule, KV-cache compaction, the drafter's bookkeeping
between proposals (observe, syncing its caches) and the Python around all of it. So measured /
predicted is a real check: below 1 by the share of those overheads, far below 1 when something in
the engine costs more than it should.

Leviathan et al. (arXiv 2211.17192, section 3) give the expected tau of a draft whose positions are
accepted with conditional rates a_k: 1 + sum_k prod_{i<=k} a_i (`expected_tau`), used to model other
draft lengths than the one measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbench.analysis.cost_table import CostTable
from specbench.core.errors import SpecbenchError
from specbench.core.records import CostPrediction


def expected_tau(acceptance_by_position: Sequence[float], depth: int | None = None) -> float:
    """Expected tokens per step for drafts of `depth` positions (all measured ones by default)."""
    tau, reach = 1.0, 1.0
    for k, a in enumerate(acceptance_by_position[:depth], start=1):
        if not 0.0 <= a <= 1.0:
            raise SpecbenchError(f"acceptance at draft position {k} must be in [0, 1], got {a!r}")
        reach *= a
        tau += reach
    return tau


@dataclass(frozen=True)
class StepShape:
    """What a run measured of a strategy's steps (means over them)."""

    tau: float
    verified: float  # positions per verify forward (drafts + 1)
    budget: float  # the controller's draft budget
    context: float  # positions already in the cache
    tree: bool  # verified with a tree mask


def predict(shape: StepShape, table: CostTable, drafter: str | None, batch: int = 1) -> CostPrediction:
    """Predicted step times and speedup over `ar` from `table`; `drafter` is the table's key for the
    strategy's proposals (None for `ar`)."""
    ar_step = table.target_s(1, shape.context, batch)
    verify = table.target_s(shape.verified, shape.context, batch, shape.tree)
    draft = table.drafter_s(drafter, shape.budget) if drafter is not None else 0.0
    return CostPrediction(shape.tau * ar_step / (draft + verify), draft, verify, ar_step, shape.tau, shape.verified,
                          shape.budget, shape.context, shape.tree)
