"""What an engine provides to a run: a check of the run's plan before anything loads, its strategies, the
decoding of a list of prompts at a batch size into `Generation`s (decoding/decode.py), a report of its own.

An engine module defines one class that follows `Backend` and is listed in registry.py. Every path (run,
tune, warm-up, batch sizes above 1) decodes through `Backend.decode`. The pipeline times each call and
checks its output; an engine decodes and counts, and never times itself into a row.

What only some engines do is a capability of its own, a small runtime-checkable protocol below, which an
engine declares by defining its methods and the pipeline asks for with isinstance: an engine that lacks
one needs no empty stub, and the pipeline's fallback (a note, a file not written, a study refused) sits in
one place instead of behind a None each engine returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pathlib import Path

    # the checks are torch-free; these types are for the loaded run
    from specbench.core.records import EngineReport
    from specbench.decoding.batch import BatchGeneration
    from specbench.decoding.decode import Generation
    from specbench.decoding.sampling import Sampling
    from specbench.decoding.target import Target
    from specbench.methods.build import Strategy
    from specbench.methods.names import StrategyName
    from specbench.methods.published.formats import DrafterSource


@dataclass(frozen=True)
class EnginePlan:
    """What a run asks of an engine, resolved once from the run's plan (plan/run_config.py): `check` reads it before
    anything loads, and an engine is made from it."""

    specs: tuple[StrategyName, ...]  # `ar` first: the strategies this engine runs
    knobs: dict[str, dict[str, Any]]
    controller: str | None
    batch_sizes: list[int]
    temperature: float
    engine_args: dict[str, Any]
    model: str  # the target's directory, or the hub id it is cached under
    device: str
    dtype: str
    seed: int
    drafter_sources: dict[str, DrafterSource]  # method -> its drafter's checkpoint and format
    draft_schedule: dict[str, dict[str, list[int]]]  # strategy -> its draft caps per batch size


@dataclass(frozen=True)
class TargetTimes:
    """Seconds of one verify forward of `tokens` positions after `context` cached ones, each round's."""

    tokens: int
    context: int
    seconds: list[float]


@dataclass
class Decoded:
    """One strategy's generations of a list of prompts, and the batch's own figures where the list was
    decoded in lockstep (None: each sequence decoded alone)."""

    sequences: list[Generation]
    batch: BatchGeneration | None = None


class Runner(Protocol):
    """Decodes one prompt: called with the prompt's token ids, the new tokens at most, the sampling
    settings and the prompt's seed (bench/decode_groups.py prompt_seed), as decoding.decode.generate is."""

    def __call__(self, prompt: list[int], max_new_tokens: int, sampling: Sampling, seed: int) -> Generation: ...


class Backend(Protocol):
    """One engine of a run. Made before the target loads from the plan of the strategies it runs: what can
    be refused without a model (a method the engine lacks, its engine arguments) is refused there; started
    once the target is loaded."""

    name: ClassVar[str]  # what --engine calls it; rows and labels (`ngram@vllm`) carry it
    title: ClassVar[str]  # how messages name it: "vLLM"
    takes_engine_args: ClassVar[bool]  # --engine-args are its own
    notes: list[str]  # what the run changed from its configuration for this engine, once started

    @staticmethod
    def check(plan: EnginePlan) -> None:
        """Refuse, in one SpecbenchError line, what the engine cannot run (batch sizes above 1 included,
        where it decodes one sequence at a time); torch-free, nothing loaded."""

    def __init__(self, plan: EnginePlan) -> None: ...

    def start(self, target: Target) -> list[Strategy]:
        """The plan's strategies in this engine, ready to decode (an engine may start a process each)."""

    def decode(self, strategy: Strategy, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
               max_new_tokens: int, batch_size: int = 1) -> Decoded:
        """`prompts` (at most `batch_size` of them: a suite's last batch may hold fewer) decoded by one of its
        strategies, each sequence from its own seed."""

    def report(self) -> EngineReport:
        """What the engine did in the run besides decoding: start-up time, anything of its own."""

    def close(self) -> None:
        """Stop whatever the engine started."""


@runtime_checkable
class Tunable(Protocol):
    """An engine tune can measure in: one more configuration per trial, after start."""

    def strategy(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        """One more configuration, started."""

    def release(self, strategy: Strategy) -> None:
        """Free what `strategy` holds once it is measured."""

    @staticmethod
    def untunable(method: str) -> tuple[str, ...]:
        """The method's knobs (and `controller`) this engine has no counterpart for: tune leaves them at
        their defaults."""


@runtime_checkable
class TimesTarget(Protocol):
    """An engine whose target forwards are timed apart from any strategy, so that the cost model prices its
    strategies with its own forwards (specbench's are timed directly, in bench/cost_timing.py)."""

    def target_costs(self, contexts: list[int], lengths: list[int], repeats: int,
                     warmup: int) -> list[TargetTimes] | None:
        """The target's verify forward of each of `lengths` tokens after each of `contexts` cached positions,
        as this engine runs it; None where this run's engine cannot time them."""


@runtime_checkable
class Deploys(Protocol):
    """An engine whose users configure a strategy in a form of its own (tune writes it beside the TOML)."""

    def deployed_config(self, strategy: Strategy) -> dict[str, Any] | None:
        """The strategy as this engine's users configure it (vLLM's speculative_config); None: nothing to say."""


@runtime_checkable
class Compiles(Protocol):
    """An engine that compiles for the shapes it meets (vLLM's torch.compile): its warm-up is repeated until a
    pass's time settles (bench/decode_groups.py `warm_up`)."""

    def compiles(self, strategy: Strategy) -> bool:
        """Whether the strategy's engine compiles (not where it runs eagerly: vLLM's enforce_eager)."""


@runtime_checkable
class KeepsLog(Protocol):
    """An engine that logs what it does to a file of its own."""

    def keep_log(self, directory: Path) -> None:
        """Move what the engine logged during the run into the run's directory, once it has stopped."""


def one_at_a_time(strategy: Strategy, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
                  max_new_tokens: int) -> Decoded:
    """Each prompt decoded alone by the strategy's runner: an engine whose `check` refuses batch sizes above 1."""
    return Decoded([strategy.runner(prompt, max_new_tokens, sampling, seed) for prompt, seed in zip(prompts, seeds)])
