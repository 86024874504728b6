"""transformers' own `generate` as an engine: `ar` is plain `generate`, `draft` is assisted generation with
the draft model (`assistant_model=`, Leviathan et al. 2211.17192), `ngram` is prompt lookup decoding
(`prompt_lookup_num_tokens=`, apoorvumang/prompt-lookup-decoding). Nothing is re-implemented: the figures
are those of the library most users start from, on the same target and the same prompts.

`generate` reports no counts of its own, so a hook on the target counts its forwards: each forward's new
positions are the last committed token (the whole prompt, on the first) and the drafts it verifies, and
where the next forward starts says how many of them were kept (transformers crops its cache to the
committed tokens after each verification).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specbench.core.errors import SpecbenchError
from specbench.core.records import EngineReport
from specbench.engines.protocol import one_at_a_time

if TYPE_CHECKING:
    from specbench.decoding.decode import Generation
    from specbench.decoding.sampling import Sampling
    from specbench.decoding.target import Target
    from specbench.engines.protocol import Decoded, EnginePlan
    from specbench.methods.build import Strategy
    from specbench.methods.names import StrategyName

TRANSFORMERS = "transformers"
RUNS = ("ar (generate), draft (assisted generation, assistant_model=) and ngram (prompt lookup, "
        "prompt_lookup_num_tokens=)")
# specbench's controllers and the draft-length schedules of transformers' assistants (the heuristic is theirs)
SCHEDULES = {"fixed": "constant", "heuristic": "heuristic"}


def generate_arguments(name: str, options: Any, controller: str) -> dict[str, Any]:
    """The arguments of `generate` (and of the assistant's generation config) that run a method as specbench's
    knobs set it: the draft length, and for prompt lookup the longest n-gram matched."""
    if name == "ngram":
        return {"prompt_lookup_num_tokens": options.num_pred_tokens, "max_matching_ngram_size": options.max_ngram}
    # transformers reads the draft length from the assistant's own generation config; its confidence-based
    # early stop is off so that exactly k tokens are drafted a round, as specbench's draft does
    return {"num_assistant_tokens": options.k, "num_assistant_tokens_schedule": SCHEDULES[controller],
            "assistant_confidence_threshold": 0.0}


@dataclass
class Forwards:
    """The target's forwards during one `generate` call: for each, the positions already cached, the new
    positions it ran, and when it returned."""

    cached: list[int] = field(default_factory=list)
    new: list[int] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)

    def before(self, module, args, kwargs) -> None:
        cache = kwargs.get("past_key_values")
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.cached.append(int(cache.get_seq_length()) if cache is not None else 0)
        self.new.append(int(ids.shape[1]))

    def after(self, module, args, kwargs, output) -> None:
        self.ended.append(time.perf_counter())


def generation(forwards: Forwards, prompt_len: int, tokens: list[int], eos_ids: frozenset[int], started: float,
               wall_s: float) -> Generation:
    """One `generate` call as the engine's record. A forward's drafts are its new positions beyond the
    committed ones; the tokens it committed are where the next forward starts (the end, after the last)."""
    from specbench.decoding.decode import Generation

    before = [prompt_len] + [cached + 1 for cached in forwards.cached[1:]]  # committed when each forward ran
    after = before[1:] + [prompt_len + len(tokens)]
    drafted = [cached + new - committed for cached, new, committed in zip(forwards.cached, forwards.new, before)]
    accepted = [max(0, done - start - 1) for start, done in zip(before, after)]
    by_position = [sum(1 for a in accepted if a > k) for k in range(max(accepted, default=0))]
    by_drafted = [sum(1 for d in drafted if d == n) for n in range(max(drafted, default=0) + 1)]
    nan = math.nan
    return Generation(tokens=tokens, steps=len(drafted), drafted=sum(drafted), accepted=sum(accepted),
                      verified=sum(drafted) + len(drafted), max_verified=max(drafted, default=0) + 1,
                      draft_depth=sum(drafted), budget=sum(drafted), tree_steps=0, accept_by_position=by_position,
                      steps_by_drafted=by_drafted, prefill_s=nan, draft_s=nan, verify_s=nan, other_s=nan,
                      ttft_s=forwards.ended[0] - started if forwards.ended else 0.0, wall_s=wall_s,
                      stop_reason="eos" if tokens and tokens[-1] in eos_ids else "length")


@dataclass
class GenerateRunner:
    """One strategy as `generate` runs it: its arguments (the assistant model included) fixed, the prompt,
    length, sampling and seed per call."""

    target: Target
    arguments: dict[str, Any]

    def __call__(self, prompt: list[int], max_new_tokens: int, sampling: Sampling, seed: int) -> Generation:
        import torch

        ids = torch.tensor([prompt], dtype=torch.long, device=self.target.device)
        sampled = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
                   "top_k": sampling.top_k} if not sampling.greedy else {"do_sample": False}
        eos = sorted(self.target.eos_ids)
        forwards = Forwards()
        hooks = [self.target.model.register_forward_pre_hook(forwards.before, with_kwargs=True),
                 self.target.model.register_forward_hook(forwards.after, with_kwargs=True)]
        torch.manual_seed(seed)  # the prompt's seed, as specbench's own engine seeds a sequence
        try:
            started = time.perf_counter()
            out = self.target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                             min_new_tokens=0, eos_token_id=eos or None,
                                             pad_token_id=eos[0] if eos else 0, **sampled, **self.arguments)
            wall_s = time.perf_counter() - started
        finally:
            for hook in hooks:
                hook.remove()
        return generation(forwards, len(prompt), out[0, len(prompt):].tolist(), self.target.eos_ids, started, wall_s)


class TransformersBackend:
    """transformers' `generate` in a run: `ar`, `draft` and `ngram`, one sequence at a time. Its forwards are
    not timed apart (it is no `TimesTarget`): `generate` keeps no cache between calls to time a verify
    forward through."""

    name = TRANSFORMERS
    title = "transformers"
    takes_engine_args = False

    @staticmethod
    def check(plan: EnginePlan) -> None:
        """What `generate` has no counterpart for is refused in one line, never silently replaced."""
        refused = [s.name for s in plan.specs if s.members and s.name not in ("draft", "ngram")]
        if refused:
            raise SpecbenchError(f"--engine {TRANSFORMERS} runs {RUNS}; not {', '.join(refused)}")
        if plan.controller is not None and plan.controller not in SCHEDULES:
            raise SpecbenchError(f"--engine {TRANSFORMERS}: --controller {plan.controller} has no counterpart in "
                                 f"transformers' assistants (they take {' or '.join(SCHEDULES)})")
        if plan.controller == "heuristic" and any(s.name == "ngram" for s in plan.specs):
            raise SpecbenchError(f"--engine {TRANSFORMERS}: prompt lookup drafts a fixed length; ngram takes no "
                                 "--controller heuristic there")
        if plan.batch_sizes != [1]:
            raise SpecbenchError(f"--engine {TRANSFORMERS} measures batch size 1 only (generate's batches pad "
                                 "and run in lockstep, which is not how it is timed here)")

    def __init__(self, plan: EnginePlan):
        self.plan = plan
        self.target: Target | None = None
        self.start_s: dict[str, float] = {}
        self.notes: list[str] = []

    def start(self, target: Target) -> list[Strategy]:
        self.target = target
        return [self.strategy(spec, self.plan.knobs, self.plan.controller) for spec in self.plan.specs]

    def decode(self, strategy: Strategy, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
               max_new_tokens: int, batch_size: int = 1) -> Decoded:
        return one_at_a_time(strategy, prompts, seeds, sampling, max_new_tokens)

    def strategy(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        """The strategy's `generate` arguments; `draft` loads its draft model (the one specbench's draft uses)."""
        from specbench.methods.build import Strategy, build_strategy
        from specbench.methods.knobs import make_options
        from specbench.methods.registry import definition

        if not spec.members:
            arguments: dict[str, Any] = {}
        else:
            (name,) = spec.members
            method = definition(name)
            arguments = generate_arguments(name, make_options(name, knobs.get(name, {})),
                                           controller or method.default_controller)
        described = {TRANSFORMERS: {"generate": dict(arguments)}} if arguments else {}
        if spec.name == "draft":
            started = time.perf_counter()
            assistant = build_strategy(spec, self.target, knobs, self.plan.drafter_sources).drafter.model
            for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
                setattr(assistant.generation_config, key, arguments.pop(key))
            arguments["assistant_model"] = assistant
            self.start_s[spec.name] = time.perf_counter() - started  # loading the assistant: the one start-up
        return Strategy(spec.name, None, None, drafter_sources=described, engine=TRANSFORMERS,
                        runner=GenerateRunner(self.target, arguments))

    def release(self, strategy: Strategy) -> None:
        """The assistant model goes with the strategy."""

    @staticmethod
    def untunable(method: str) -> tuple[str, ...]:
        """The controller: prompt lookup drafts a fixed length, and tune keeps the assistants' at the default."""
        return ("controller",)

    def deployed_config(self, strategy: Strategy) -> dict[str, Any] | None:
        """The arguments of `generate` measured."""
        return strategy.drafter_sources.get(TRANSFORMERS, {}).get("generate")

    def report(self) -> EngineReport:
        return EngineReport(TRANSFORMERS, dict(self.start_s))

    def close(self) -> None:
        """Everything ran in this process."""

BACKEND = TransformersBackend
