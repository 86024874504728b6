"""Everything a benchmark run needs, loaded once and checked before anything is measured: the target,
its engines and their strategies (engines/), the prompts that fit the model's context and the batch
sizes that run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from specbench.analysis.device_metrics import RunMetrics
from specbench.analysis.hardware import GpuProfile
from specbench.core.errors import SpecbenchError
from specbench.core.records import WarmUp
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import Target, context_limit, encode_turn, load_target, resolve_device, resolve_dtype
from specbench.engines.engine_registry import backend, run_order
from specbench.engines.protocol import Backend
from specbench.methods.build import Strategy, verifies_trees
from specbench.methods.knobs import validate_knobs
from specbench.methods.registry import definitions
from specbench.plan.run_config import RunConfig, RunPlan
from specbench.plan.suites import Suite

VERIFY_MARGIN = 64  # positions a verified draft may add beyond prompt + answer


@dataclass
class PreparedRun:
    """Everything a run needs, loaded once: the target, its strategies, the prompts."""

    plan: RunPlan
    target: Target
    strategies: list[Strategy]  # the reference engine's (plan.reference)
    suite: Suite
    sampling: Sampling
    metrics: RunMetrics
    skipped: list[str] = field(default_factory=list)  # prompts that would not fit in the model's context
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # what runs: none above the suite's size
    notes: list[str] = field(default_factory=list)  # what the run changed from its configuration
    backends: dict[str, Backend] = field(default_factory=dict)  # every engine, started, the reference first
    engine_strategies: list[Strategy] = field(default_factory=list)  # the other engines' strategies
    warmups: list[WarmUp] = field(default_factory=list)  # each strategy's warm-up, once warmed (bench/decode_groups.py)

    @property
    def config(self) -> RunConfig:
        return self.plan.config

    @property
    def profile(self) -> GpuProfile | None:
        """The --gpu profile to project onto."""
        return self.plan.profile

    @cached_property
    def first_turns(self) -> list[list[int]]:
        """Each prompt's first turn, tokenized: what the warm-up decodes and the cost model's contexts are read from."""
        return [encode_turn(self.target.tokenizer, item) for item in self.suite.items]

    @property
    def runs(self) -> list[Strategy]:
        """Everything measured on each prompt: the reference engine's strategies, then the other engines'."""
        return self.strategies + self.engine_strategies

    def close(self) -> None:
        """Stop what the engines started (vLLM's engine processes)."""
        for started in self.backends.values():
            started.close()


def prepare(plan: RunPlan) -> PreparedRun:
    """Load the models of a run's plan, checked before anything loads."""
    config = plan.config
    validate_knobs(config.knobs)
    trees = [s.name for s in plan.strategies if verifies_trees(s)]
    if trees and config.batch_sizes[-1] > 1:
        chains = ", ".join(name for name, method in definitions().items() if not method.tree)
        raise SpecbenchError(f"{', '.join(trees)} verify token trees, which run at batch size 1 only; batched "
                             f"decoding (--batch-size above 1) runs ar and {chains}")
    backends = open_backends(plan)
    device = resolve_device(config.device)
    target = load_target(config.model, device, resolve_dtype(config.dtype, device))
    sampling = Sampling(config.temperature, config.top_p, config.top_k)
    suite, skipped = fitting_prompts(plan.suite, target, config.max_new_tokens)
    batch_sizes, notes = fit_batch_sizes(config.batch_sizes, len(suite.items))
    bench = PreparedRun(plan, target, [], suite, sampling, RunMetrics(device), skipped, batch_sizes,
                        notes, backends)
    try:
        for name, engine in backends.items():
            started = engine.start(target)
            if name == plan.reference:
                bench.strategies = started
            else:
                bench.engine_strategies += started
            bench.notes += engine.notes
    except BaseException:
        bench.close()
        raise
    return bench


def open_backends(plan: RunPlan) -> dict[str, Backend]:
    """Every engine of the run, made (and what they refuse refused) before any model loads. The reference
    engine's `ar` runs in every run, listed or not: the engines' agreement is read against it."""
    alone = replace(plan.engine, specs=plan.strategies[:1])
    return {name: backend(name)(plan.engine if name in plan.engines else alone)
            for name in run_order(plan.engines, plan.reference)}


def fit_batch_sizes(batch_sizes: list[int], prompts: int) -> tuple[list[int], list[str]]:
    """Batch sizes above the number of prompts become that number (once); a note says so."""
    fitted = sorted({min(b, prompts) for b in batch_sizes})
    too_big = [b for b in batch_sizes if b > prompts]
    notes = [f"batch size {', '.join(map(str, too_big))} is more than the {prompts} prompts selected: "
             f"batch size {prompts} is measured instead"] if too_big else []
    return fitted, notes


def fits(target: Target, prompt: list[int], max_new_tokens: int) -> bool:
    limit = context_limit(target)
    return limit is None or len(prompt) + max_new_tokens + VERIFY_MARGIN <= limit


def fitting_prompts(suite: Suite, target: Target, max_new_tokens: int) -> tuple[Suite, list[str]]:
    """The suite without the prompts whose first turn, answer and drafts would not fit in the model's
    context (never measured past it), and their ids; none fitting is an error."""
    keep, skipped = [], []
    for item in suite.items:
        ok = fits(target, encode_turn(target.tokenizer, item), max_new_tokens)
        (keep if ok else skipped).append(item)
    if not keep:
        raise SpecbenchError(f"no prompt of the suite fits the model's context of {context_limit(target)} tokens "
                             f"with {max_new_tokens} new tokens; use a shorter suite or --max-new-tokens")
    return Suite(suite.name, tuple(keep)), [item.id for item in skipped]
