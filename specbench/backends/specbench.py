"""specbench's own engine (engine/): every method, their combinations and controllers, at every batch size.

It is the reference engine: its `ar` runs in every run, its outputs are the lossless reference, and the
other engines' agreement and transfer are read against it. torch and the drafters load in `start`, so
that `check` runs before either.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from specbench.core.engine_names import SPECBENCH
from specbench.core.records import EngineReport
from specbench.draft_schedule import cap_at
from specbench.strategies.controllers import CappedController

if TYPE_CHECKING:
    from pathlib import Path

    from specbench.backends.protocol import EnginePlan
    from specbench.config import RunPlan
    from specbench.engine.decode import Generation
    from specbench.engine.protocol import Controller
    from specbench.engine.sampling import Sampling
    from specbench.models import Target
    from specbench.strategies.build import Strategy
    from specbench.strategies.names import StrategyName

Schedule = dict[str, dict[str, list[int]]]  # RunConfig.draft_schedule


def new_controller(strategy: Strategy, schedule: Schedule, batch_size: int) -> Controller | None:
    """A fresh controller for one sequence, capped where the run's draft schedule says so at this batch size."""
    if strategy.new_controller is None:
        return None
    controller = strategy.new_controller()
    entry = schedule.get(strategy.name)
    cap = cap_at(entry, batch_size) if entry else None
    return controller if cap is None else CappedController(controller, cap)


def generate(*args: Any, **kwargs: Any) -> Generation:
    """engine.decode.generate, imported when a sequence is first decoded (this module loads before torch)."""
    from specbench.engine import decode

    return decode.generate(*args, **kwargs)


def decode_one(target: Target, strategy: Strategy, schedule: Schedule, prompt: list[int], max_new_tokens: int,
               sampling: Sampling, seed: int) -> Generation:
    """One sequence alone, in the single-sequence loop (engine/decode.py)."""
    import torch

    torch.manual_seed(seed)
    return generate(target.model, prompt, max_new_tokens, sampling, target.eos_ids, strategy.drafter,
                    new_controller(strategy, schedule, 1), seed)


class SpecbenchBackend:
    name = SPECBENCH
    title = "specbench"
    takes_engine_args = False
    batches = True

    @staticmethod
    def check(plan: EnginePlan) -> None:
        """Every method, combination and controller runs here: nothing to refuse."""

    def __init__(self, plan: RunPlan, specs: tuple[StrategyName, ...]):
        self.config = plan.config
        self.specs = specs
        self.sources = plan.drafter_sources
        self.target: Target | None = None
        self.notes: list[str] = []

    def start(self, target: Target) -> list[Strategy]:
        self.target = target
        return [self.strategy(spec, self.config.knobs, self.config.controller) for spec in self.specs]

    def strategy(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        from specbench.strategies.build import build_strategy

        strategy = build_strategy(spec, self.target, knobs, self.sources, controller)
        strategy.runner = functools.partial(decode_one, self.target, strategy, self.config.draft_schedule)
        return strategy

    def release(self, strategy: Strategy) -> None:
        """A drafter holds nothing beyond its Python objects."""

    @staticmethod
    def untunable(method: str) -> tuple[str, ...]:
        return ()

    def deployed_config(self, strategy: Strategy) -> dict[str, Any] | None:
        return None

    def target_costs(self, contexts: list[int], lengths: list[int], repeats: int, warmup: int) -> None:
        """Timed directly by the cost table (measure/cost_timing.py), cached across runs."""

    def report(self) -> EngineReport:
        """Nothing of its own: its start-up is the run's (the target's loading and the warm-up)."""
        return EngineReport(SPECBENCH)

    def close(self) -> None:
        """Nothing runs outside this process."""

    def keep_log(self, directory: Path) -> None:
        """It logs nothing of its own."""


BACKEND = SpecbenchBackend
