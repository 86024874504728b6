"""What an engine provides to a run: checks of the run's plan before anything loads, its strategies (each
with a runner that decodes one prompt into a `Generation`, engine/decode.py), and a report of its own.

An engine module defines one class that follows `Backend` and is listed in registry.py. The pipeline times
each runner call and checks its output; an engine decodes and counts, and never times itself into a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    # the checks are torch-free; these types are for the loaded run
    from specbench.config import RunPlan
    from specbench.core.records import EngineReport
    from specbench.engine.decode import Generation
    from specbench.engine.sampling import Sampling
    from specbench.models import Target
    from specbench.strategies.build import Strategy
    from specbench.strategies.names import StrategyName


@dataclass(frozen=True)
class EnginePlan:
    """What a run asks of an engine, as the command line and TOML gave it: every check reads this alone."""

    specs: list[StrategyName]  # `ar` first
    knobs: dict[str, dict[str, Any]]
    controller: str | None
    batch_sizes: list[int]
    temperature: float
    engine_args: dict[str, Any]


@dataclass(frozen=True)
class TargetTimes:
    """Seconds of one verify forward of `tokens` positions after `context` cached ones, each round's."""

    tokens: int
    context: int
    seconds: list[float]


class Runner(Protocol):
    """Decodes one prompt: called with the prompt's token ids, the new tokens at most, the sampling
    settings and the prompt's seed (benchmark/decoding.py prompt_seed), as engine.decode.generate is."""

    def __call__(self, prompt: list[int], max_new_tokens: int, sampling: Sampling, seed: int) -> Generation: ...


class Backend(Protocol):
    """One engine of a run. Made before the target loads, from the run's plan and the strategies it runs
    (of the plan's): what can be refused without a model (a method the engine lacks, its engine arguments)
    is refused there; started once the target is loaded."""

    name: ClassVar[str]  # what --engine calls it; rows and labels (`ngram@vllm`) carry it
    title: ClassVar[str]  # how messages name it: "vLLM"
    takes_engine_args: ClassVar[bool]  # --engine-args are its own
    batches: ClassVar[bool]  # decodes batch sizes above 1 (specbench's lockstep loop); else batch size 1 only
    notes: list[str]  # what the run changed from its configuration for this engine

    @staticmethod
    def check(plan: EnginePlan) -> None:
        """Refuse, in one SpecbenchError line, what the engine cannot run; torch-free, nothing loaded."""

    def __init__(self, plan: RunPlan, specs: tuple[StrategyName, ...]) -> None: ...

    def start(self, target: Target) -> list[Strategy]:
        """The run's strategies in this engine, their runners ready (an engine may start a process each)."""

    def strategy(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        """One more configuration, after start (tune measures one per trial)."""

    def release(self, strategy: Strategy) -> None:
        """Free what `strategy` holds once it is measured."""

    @staticmethod
    def untunable(method: str) -> tuple[str, ...]:
        """The method's knobs (and `controller`) this engine has no counterpart for: tune leaves them at
        their defaults."""

    def deployed_config(self, strategy: Strategy) -> dict[str, Any] | None:
        """The strategy as this engine's users configure it (vLLM's speculative_config); None: nothing of its own."""

    def target_costs(self, contexts: list[int], lengths: list[int], repeats: int,
                     warmup: int) -> list[TargetTimes] | None:
        """The target's verify forward of each of `lengths` tokens after each of `contexts` cached positions,
        as this engine runs it, timed apart from any strategy (the cost model prices the engine's strategies
        with them). None: not timed this way (specbench's own forwards are timed directly, in
        measure/cost_timing.py)."""

    def report(self) -> EngineReport:
        """What the engine did in the run besides decoding: start-up time, anything of its own."""

    def close(self) -> None:
        """Stop whatever the engine started."""

    def keep_log(self, directory: Path) -> None:
        """Move what the engine logged during the run into the run's directory, once it has stopped."""
