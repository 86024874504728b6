"""vLLM as a second engine: the same prompts decoded by vLLM's own `LLM`, one engine per strategy.

Nothing of vLLM is re-implemented: each strategy is vLLM's own method, configured from the method's
declared translation (Method.serving) and the drafter converted once into the layout vLLM loads.
Time is measured around each `generate` call, one request at a time; tau and per-position acceptance
come from vLLM's own counts for that request.

An engine's processes are stopped (SIGSTOP) whenever it is not serving its own request, and continued
(SIGCONT) for it: an idle vLLM worker busy-polls its shared-memory queue for a second after each
request (vLLM's SpinCondition), measured here at 40-100% of a core, which on a small machine
would be taken from whichever engine is timed next. Every engine is timed alone.

vLLM starts its engine processes with spawn, so this module is imported only where an engine is
made and has no side effects at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.engine.decode import Generation
from specbench.engine.sampling import Sampling
from specbench.errors import SpecbenchError
from specbench.paths import user_cache
from specbench.strategies.knobs import make_options
from specbench.strategies.names import StrategyName
from specbench.strategies.published.formats import DrafterSource
from specbench.strategies.published.to_vllm import vllm_drafter_dir
from specbench.strategies.registry import definition

CPU_KV_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class VllmStrategy:
    """One strategy as vLLM runs it: its speculative_config (None for `ar`) and what it leaves out."""

    name: str
    speculative_config: dict[str, Any] | None
    untranslated: tuple[str, ...] = ()  # default settings of specbench's that vLLM runs without


def translate(spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None,
              sources: dict[str, DrafterSource]) -> VllmStrategy:
    """The vLLM form of a single strategy, its drafter not yet converted. A knob or controller the user
    set that vLLM has no counterpart for is refused (vLLM would silently ignore it), as is a method vLLM
    cannot run for this target; checked before any model loads."""
    if not spec.members:
        return VllmStrategy(spec.name, None)
    (name,) = spec.members
    method = definition(name)
    set_knobs = knobs.get(name, {})
    serving = (method.serving(make_options(name, set_knobs), controller or method.default_controller, None)
               if method.serving else None)
    if serving is None or serving.vllm is None:
        raise SpecbenchError(f"--engine vllm: {name} has no vLLM counterpart")
    refused = [k for k in serving.vllm_missing if k in set_knobs or (k == "controller" and controller)]
    if refused:
        raise SpecbenchError(f"--engine vllm: {name}'s {', '.join(refused)} {'has' if len(refused) == 1 else 'have'} "
                             "no vLLM counterpart (vLLM would ignore it); drop it or use --engine specbench")
    source = sources.get(name)
    if "model" not in serving.vllm and name == "mtp" and not (source and source.published):
        raise SpecbenchError("--engine vllm: mtp runs in vLLM only from MTP layers inside the target's own "
                             "checkpoint (DeepSeek-V3, Qwen3-Next, MiMo); this target has none")
    return VllmStrategy(spec.name, dict(serving.vllm), serving.vllm_missing)


def drafter_cache() -> Path:
    """Where specbench's drafters are kept in vLLM's layouts, written once and reused by every run: the
    user's cache (XDG_CACHE_HOME), not a results directory, which a refused run leaves untouched."""
    return user_cache() / "vllm_drafters"


def with_drafter(strategy: VllmStrategy, sources: dict[str, DrafterSource], target, cache_root: Path) -> VllmStrategy:
    """The strategy with its drafter in the layout vLLM loads (converted once, cached under `cache_root`)."""
    config = strategy.speculative_config
    if not config or "model" not in config:
        return strategy
    source = sources.get(strategy.name)
    model = vllm_drafter_dir(strategy.name, source.path if source else None, target, cache_root)
    return dataclasses.replace(strategy, speculative_config={**config, "model": str(model)})


def quiet_vllm() -> None:
    """vLLM logs to stdout at INFO by default, where specbench prints its table or JSON: its own settings
    (read once, at vLLM's first import, and inherited by its engine processes) move it to stderr, warnings up."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def engine_kwargs(model_dir: str, dtype: torch.dtype, seed: int, engine_args: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine arguments: specbench's defaults under the user's `--engine-args`."""
    quiet_vllm()
    from vllm.engine.arg_utils import EngineArgs

    known = set(inspect.signature(EngineArgs).parameters)
    unknown = sorted(set(engine_args) - known)
    if unknown:
        raise SpecbenchError(f"--engine-args: vLLM has no engine argument {', '.join(unknown)}")
    owned = sorted(set(engine_args) & {"model", "speculative_config", "seed", "dtype"})
    if owned:
        raise SpecbenchError(f"--engine-args: {', '.join(owned)} come from the run (--model, --strategy and its knobs, "
                             "--seed, --dtype); set them there")
    defaults = {"model": model_dir, "dtype": str(dtype).removeprefix("torch."), "seed": seed, "enforce_eager": True,
                "disable_log_stats": False}
    if not torch.cuda.is_available():  # vLLM's CPU backend would reserve 4 GiB per engine: a run holds several
        defaults["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return {**defaults, **engine_args}


class VllmEngine:
    """vLLM's engines of one run or study, one `LLM` per strategy, all alive so that prompts interleave."""

    def __init__(self, kwargs: dict[str, Any]):
        self.kwargs = kwargs
        self.runners: list[VllmRunner] = []
        self.start_s: dict[str, float] = {}  # each engine's start-up, part of a user's wait

    def arguments(self, strategy: VllmStrategy) -> dict[str, Any]:
        """The engine's arguments for one strategy; a speculative one reports its counts per request."""
        if strategy.speculative_config is None:
            return self.kwargs
        return {**self.kwargs, "speculative_config": strategy.speculative_config,
                "per_request_spec_decode_metrics": "summary"}

    def check(self, strategy: VllmStrategy) -> None:
        """vLLM's own validation of the configuration (this device's model runner included), before any
        engine process starts: a method the runner rejects is refused in one line, not after minutes."""
        from vllm.engine.arg_utils import EngineArgs

        try:
            EngineArgs(**self.arguments(strategy)).create_engine_config()
        except (ValueError, TypeError, RuntimeError) as exc:
            raise SpecbenchError(f"vLLM refused {strategy.name}: {_reason(exc)}") from None

    def start(self, strategy: VllmStrategy) -> VllmRunner:
        from vllm import LLM

        started = time.perf_counter()
        try:
            llm = LLM(**self.arguments(strategy))
        except (ValueError, TypeError, RuntimeError) as exc:
            raise SpecbenchError(f"vLLM refused {strategy.name}: {_reason(exc)}") from None
        self.start_s[strategy.name] = time.perf_counter() - started
        runner = VllmRunner(strategy.name, llm, engine_processes(llm))
        runner.pause()
        self.runners.append(runner)
        return runner

    @property
    def idle_engines(self) -> str:
        """What was done with the engines while another one (or specbench's engine) was timed."""
        if all(runner.processes for runner in self.runners):
            return "stopped (SIGSTOP) outside their own requests"
        return "left running: vLLM's engine processes were not found"

    def stop(self, runner: VllmRunner) -> None:
        runner.close()
        self.runners.remove(runner)

    def close(self) -> None:
        for runner in self.runners:
            runner.close()
        self.runners.clear()


@dataclass
class VllmRunner:
    """One strategy's vLLM engine, called as the engine's `generate` is."""

    name: str
    llm: Any
    processes: list = dataclasses.field(default_factory=list)  # psutil.Process of its engine core and workers

    def _signal(self, signum: int) -> None:
        import psutil

        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):  # a process that has exited
                process.send_signal(signum)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def __call__(self, prompt: list[int], max_new_tokens: int, sampling: Sampling, seed: int) -> Generation:
        """One request, timed around the call, with vLLM's speculative-decoding counters for it."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                                top_k=sampling.top_k, seed=seed)
        self.resume()
        try:
            started = time.perf_counter()
            (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
            wall_s = time.perf_counter() - started
        finally:
            self.pause()
        return generation(out, wall_s)

    def close(self) -> None:
        self.resume()  # a stopped process would not act on the shutdown's SIGTERM
        with contextlib.suppress(Exception):
            self.llm.llm_engine.engine_core.shutdown()


def engine_processes(llm) -> list:
    """The processes of an `LLM`'s engine: its engine core (vLLM's process manager) and their children
    (the workers); empty where this vLLM keeps them elsewhere."""
    import psutil

    core = getattr(llm.llm_engine, "engine_core", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    processes = []
    for started in getattr(manager, "processes", None) or []:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(started.pid)
            processes += [root, *root.children(recursive=True)]
    return processes


def generation(out, wall_s: float) -> Generation:
    """A vLLM request as the engine's record: the first token comes from the prefill forward, then one
    verify forward per draft (`ar`: per token). vLLM does not split its time into draft and verify.

    The counts are the request's own (`per_request_spec_decode_metrics`): the histogram of drafts
    accepted per verify step and the draft tokens proposed. vLLM's process-wide counters
    (`llm.get_metrics()`) cannot serve here: each new engine in a process re-registers them, so only
    the last engine's remain readable."""
    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    stats = completion.spec_decode_metrics
    histogram = list(stats.histogram) if stats is not None else []  # [j]: verify steps that accepted j drafts
    drafts, drafted = sum(histogram), stats.num_draft_tokens if stats is not None else 0
    accepted = sum(j * count for j, count in enumerate(histogram))
    by_position = [sum(histogram[k + 1:]) for k in range(len(histogram) - 1)]  # [k]: steps accepting > k drafts
    while by_position and by_position[-1] == 0:
        by_position.pop()
    steps = 1 + drafts if drafts else len(tokens)
    width = max(1, math.ceil(drafted / drafts)) if drafts else 0
    metrics = getattr(out, "metrics", None)
    ttft = getattr(metrics, "first_token_latency", 0.0) or 0.0
    nan = math.nan
    return Generation(tokens=tokens, steps=steps, drafted=drafted, accepted=accepted, verified=steps + drafted,
                      max_verified=width + 1, draft_depth=drafted, budget=drafts * width, tree_steps=0,
                      accept_by_position=by_position, steps_by_drafted=[], prefill_s=nan, draft_s=nan, verify_s=nan,
                      other_s=nan, ttft_s=float(ttft), wall_s=wall_s,
                      stop_reason="eos" if completion.finish_reason == "stop" else "length")


def _reason(exc: BaseException) -> str:
    """One line of why: a pydantic validation error's own message, else the first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            return str(errors()[0]["msg"]).removeprefix("Value error, ")
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
