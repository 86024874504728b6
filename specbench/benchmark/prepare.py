"""Everything a benchmark run needs, loaded once and checked before anything is measured: the target,
its strategies (specbench's, and vLLM's engines with --engine vllm or both), the prompts that fit the
model's context and the batch sizes that run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.config import RunConfig
from specbench.engine.sampling import Sampling
from specbench.engines import SPECBENCH, VLLM
from specbench.errors import SpecbenchError
from specbench.hardware import GpuProfile, get_profile, load_profiles
from specbench.measure.device_metrics import RunMetrics
from specbench.model_source import model_path
from specbench.models import Target, encode_turns, load_target, resolve_device, resolve_dtype
from specbench.strategies.build import Strategy, build_strategy, verifies_trees
from specbench.strategies.knobs import validate_knobs
from specbench.strategies.names import StrategyName, parse_strategies, parse_strategy
from specbench.strategies.published.formats import DrafterSource, drafter_dirs_by_strategy
from specbench.strategies.registry import definitions
from specbench.suites import Suite, load_suite, select

if TYPE_CHECKING:  # imported where an engine is made: vLLM is an optional extra
    from specbench.vllm_engine import VllmEngine, VllmStrategy

    VllmPlan = tuple[list[VllmStrategy], dict[str, Any]]  # the strategies' vLLM forms, the engine arguments

VERIFY_MARGIN = 64  # positions a verified draft may add beyond prompt + answer
MAX_MODEL_LEN = 4096  # vLLM's context at most (--engine-args max_model_len overrides): its KV cache is preallocated


@dataclass
class PreparedRun:
    """Everything a run needs, loaded once: the target, its strategies, the prompts."""

    config: RunConfig
    target: Target
    strategies: list[Strategy]
    suite: Suite
    sampling: Sampling
    metrics: RunMetrics
    profile: GpuProfile | None  # the --gpu profile to project onto
    skipped: list[str] = field(default_factory=list)  # prompts that would not fit in the model's context
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # what runs: none above the suite's size
    notes: list[str] = field(default_factory=list)  # what the run changed from its configuration
    vllm: VllmEngine | None = None  # with --engine vllm or both: vLLM's engines, one per strategy
    vllm_strategies: list[Strategy] = field(default_factory=list)

    @property
    def runs(self) -> list[Strategy]:
        """Everything measured on each prompt: specbench's strategies, then vLLM's."""
        return self.strategies + self.vllm_strategies

    def close(self) -> None:
        """Stop vLLM's engine processes, if any."""
        if self.vllm is not None:
            self.vllm.close()


def prepare(config: RunConfig) -> PreparedRun:
    """Validate the whole configuration and load models before anything is measured."""
    config = config.validate()  # its type-checked copy, 0 for the whole suite read as no limit
    specs = parse_strategies(config.strategies)
    validate_knobs(config.knobs)
    schedule = {parse_strategy(name).name: entry for name, entry in config.draft_schedule.items()}
    sources = drafter_dirs_by_strategy(config.drafters, specs)  # formats detected before any model is loaded
    suite = select(load_suite(config.suite), config.categories or None, config.limit)
    trees = [s.name for s in specs if verifies_trees(s)]
    if trees and config.batch_sizes[-1] > 1:
        chains = ", ".join(name for name, method in definitions().items() if not method.tree)
        raise SpecbenchError(f"{', '.join(trees)} verify token trees, which run at batch size 1 only; batched "
                             f"decoding (--batch-size above 1) runs ar and {chains}")
    profile = None
    if config.gpu:
        profile = get_profile(config.gpu, load_profiles(Path(config.profiles) if config.profiles else None))
    vllm = check_vllm(config, specs, sources) if config.engine != SPECBENCH else None
    device = resolve_device(config.device)
    target = load_target(config.model, device, resolve_dtype(config.dtype, device))
    # with vLLM alone, specbench's own `ar` still runs: it is the reference the engines' agreement is read against
    own = specs if config.engine != VLLM else specs[:1]
    strategies = [build_strategy(s, target, config.knobs, sources, config.controller) for s in own]
    config = dataclasses.replace(config, draft_schedule=schedule)
    sampling = Sampling(config.temperature, config.top_p, config.top_k)
    suite, skipped = fitting_prompts(suite, target, config.max_new_tokens)
    batch_sizes, notes = fit_batch_sizes(config.batch_sizes, len(suite.items))
    bench = PreparedRun(config, target, strategies, suite, sampling, RunMetrics(device), profile, skipped, batch_sizes,
                        notes)
    if vllm is not None:
        start_vllm(bench, vllm, sources)
    return bench


def check_vllm(config: RunConfig, specs: list[StrategyName], sources: dict[str, DrafterSource]) -> VllmPlan:
    """Every strategy's vLLM form and the engine arguments, refused before any model loads."""
    from specbench import vllm_engine

    strategies = [vllm_engine.translate(s, config.knobs, config.controller, sources) for s in specs]
    dtype = resolve_dtype(config.dtype, resolve_device(config.device))  # the same as specbench's target
    return strategies, vllm_engine.engine_kwargs(model_path(config.model), dtype, config.seed, config.engine_args)


def start_vllm(bench: PreparedRun, vllm: VllmPlan, sources: dict[str, DrafterSource]) -> None:
    """vLLM's engines, one per strategy (`ar` included), with the drafters converted to vLLM's layouts."""
    from specbench import vllm_engine

    strategies, kwargs = vllm
    plans = [vllm_engine.with_drafter(s, sources, bench.target, vllm_engine.drafter_cache())
             for s in strategies]
    limit = context_limit(bench.target)
    kwargs.setdefault("max_model_len", min(limit, MAX_MODEL_LEN) if limit else MAX_MODEL_LEN)
    bench.vllm = vllm_engine.VllmEngine(kwargs)
    for plan in plans:
        bench.vllm.check(plan)
    try:
        bench.vllm_strategies = [vllm_strategy(bench, p) for p in plans]
    except BaseException:
        bench.close()
        raise
    bench.notes += [f"vLLM runs {p.name} without specbench's {', '.join(p.untranslated)} (no vLLM counterpart)"
                    for p in plans if p.untranslated]


def vllm_strategy(bench: PreparedRun, strategy: VllmStrategy) -> Strategy:
    """A strategy decoded by its own vLLM engine, started now."""
    config = strategy.speculative_config
    described = {"vllm": {"speculative_config": config, "untranslated": list(strategy.untranslated)}} if config else {}
    return Strategy(strategy.name, None, None, drafters=described, engine=VLLM, runner=bench.vllm.start(strategy))


def fit_batch_sizes(batch_sizes: list[int], prompts: int) -> tuple[list[int], list[str]]:
    """Batch sizes above the number of prompts become that number (once); a note says so."""
    fitted = sorted({min(b, prompts) for b in batch_sizes})
    too_big = [b for b in batch_sizes if b > prompts]
    notes = [f"batch size {', '.join(map(str, too_big))} is more than the {prompts} prompts selected: "
             f"batch size {prompts} is measured instead"] if too_big else []
    return fitted, notes


def context_limit(target: Target) -> int | None:
    return getattr(target.model.config, "max_position_embeddings", None)


def fits(target: Target, prompt: list[int], max_new_tokens: int) -> bool:
    limit = context_limit(target)
    return limit is None or len(prompt) + max_new_tokens + VERIFY_MARGIN <= limit


def fitting_prompts(suite: Suite, target: Target, max_new_tokens: int) -> tuple[Suite, list[str]]:
    """The suite without the prompts whose first turn, answer and drafts would not fit in the model's
    context (never measured past it), and their ids; none fitting is an error."""
    keep, skipped = [], []
    for item in suite.items:
        ok = fits(target, encode_turns(target.tokenizer, list(item.turns[:1]), []), max_new_tokens)
        (keep if ok else skipped).append(item)
    if not keep:
        raise SpecbenchError(f"no prompt of the suite fits the model's context of {context_limit(target)} tokens "
                             f"with {max_new_tokens} new tokens; use a shorter suite or --max-new-tokens")
    return Suite(suite.name, tuple(keep)), [item.id for item in skipped]
