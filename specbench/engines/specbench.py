"""specbench's own engine (decoding/): every method, their combinations and controllers, at every batch size.

A prompt alone decodes in the single-sequence loop (decoding/decode.py); a batch in lockstep (decoding/batch.py),
each sequence with its own drafter copy, controller and seeded Rng. It is the runs' reference engine
(registry.REFERENCE). torch and the drafters load in `start`, so that `check` runs before either.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from specbench.core.engine_names import SPECBENCH
from specbench.core.records import EngineReport
from specbench.engines.protocol import Decoded
from specbench.methods.controllers import CappedController
from specbench.methods.draft_schedule import cap_at

if TYPE_CHECKING:
    from specbench.decoding.decode import Generation
    from specbench.decoding.drafting import Controller
    from specbench.decoding.sampling import Sampling
    from specbench.decoding.target import Target
    from specbench.engines.protocol import EnginePlan
    from specbench.methods.build import Strategy
    from specbench.methods.names import StrategyName

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
    """decoding.decode.generate, imported when a sequence is first decoded (this module loads before torch)."""
    from specbench.decoding import decode

    return decode.generate(*args, **kwargs)


def decode_one(target: Target, strategy: Strategy, schedule: Schedule, prompt: list[int], max_new_tokens: int,
               sampling: Sampling, seed: int) -> Generation:
    """One sequence alone, in the single-sequence loop (decoding/decode.py)."""
    import torch

    torch.manual_seed(seed)
    return generate(target.model, prompt, max_new_tokens, sampling, target.eos_ids, strategy.drafter,
                    new_controller(strategy, schedule, 1), seed)


def decode_batch(target: Target, strategy: Strategy, schedule: Schedule, prompts: list[list[int]],
                 max_new_tokens: int, sampling: Sampling, seeds: list[int]) -> Decoded:
    """One batch in lockstep, each sequence with its own drafter copy, controller and seeded Rng."""
    import torch

    from specbench.decoding.batch import drafter_copies, generate_batch
    from specbench.decoding.sampling import seeded

    torch.manual_seed(seeds[0])
    drafters = drafter_copies(strategy.drafter, len(prompts)) if strategy.drafter else None
    controllers = ([new_controller(strategy, schedule, len(prompts)) for _ in prompts]
                   if strategy.drafter else None)
    rngs = [seeded(seed, target.device) for seed in seeds]
    batch = generate_batch(target.model, prompts, max_new_tokens, sampling, target.eos_ids, drafters, controllers,
                           rngs)
    return Decoded(batch.sequences, batch)


class SpecbenchBackend:
    name = SPECBENCH
    title = "specbench"
    takes_engine_args = False

    @staticmethod
    def check(plan: EnginePlan) -> None:
        """Every method, combination and controller runs here: nothing to refuse."""

    def __init__(self, plan: EnginePlan):
        self.plan = plan
        self.target: Target | None = None
        self.notes: list[str] = []

    def start(self, target: Target) -> list[Strategy]:
        self.target = target
        return [self.strategy(spec, self.plan.knobs, self.plan.controller) for spec in self.plan.specs]

    def decode(self, strategy: Strategy, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
               max_new_tokens: int, batch_size: int = 1) -> Decoded:
        """A prompt alone at batch size 1; above, the batch in lockstep, however few prompts it holds."""
        if batch_size == 1:
            return Decoded([strategy.runner(prompts[0], max_new_tokens, sampling, seeds[0])])
        return decode_batch(self.target, strategy, self.plan.draft_schedule, prompts, max_new_tokens, sampling, seeds)

    def strategy(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        from specbench.methods.build import build_strategy

        strategy = build_strategy(spec, self.target, knobs, self.plan.drafter_sources, controller)
        strategy.runner = functools.partial(decode_one, self.target, strategy, self.plan.draft_schedule)
        return strategy

    def release(self, strategy: Strategy) -> None:
        """A drafter holds nothing beyond its Python objects."""

    @staticmethod
    def untunable(method: str) -> tuple[str, ...]:
        return ()

    def report(self) -> EngineReport:
        """Nothing of its own: its start-up is the run's (the target's loading and the warm-up)."""
        return EngineReport(SPECBENCH)

    def close(self) -> None:
        """Nothing runs outside this process."""


BACKEND = SpecbenchBackend
