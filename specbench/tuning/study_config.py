"""What a tuning session is asked to do: the workload (a RunConfig, as `run` takes it) and the study settings."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field

from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError
from specbench.core.ranges import check_ranges
from specbench.engines.engine_registry import ENGINE_NAMES, backend
from specbench.engines.protocol import Tunable
from specbench.methods.knobs import validate_knobs
from specbench.methods.names import BASELINE, DEFAULT_STRATEGIES, StrategyName, parse_strategies
from specbench.plan.run_config import RunConfig, RunPlan
from specbench.serving.serve_config import Level

OBJECTIVES = {"speedup": ("maximize",), "speedup,memory": ("maximize", "minimize")}
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def check_splittable(prompts: int) -> None:
    """The held-out check needs a prompt on each side of the split."""
    if prompts < 2:
        raise SpecbenchError(f"--holdout needs at least 2 prompts to split, the selection has {prompts} "
                             "(raise --limit or choose more categories)")


@dataclass
class TuneConfig:
    """A tuning session. `workload` holds the model, drafters, prompts and decoding settings, plus knobs
    (and a controller) held fixed rather than searched; its `strategies` are ignored in favour of
    `strategies` here: one study per strategy, the default set when empty."""

    workload: RunConfig = field(default_factory=RunConfig)
    strategies: tuple[str, ...] = ()
    trials: int = 30  # the study's total (across workers and resumptions); split between strategies
    timeout: float | None = None  # seconds per worker
    study: str | None = None  # None: a name from the strategy, model, GPU and a hash of the workload
    storage: str | None = None  # an Optuna storage URL or a journal file; None: SQLite under <out>/tuning/
    workers: int = 1
    objectives: str = "speedup"
    holdout: float = 0.25
    heartbeat_s: int = 30  # RDB storages: a trial silent for twice this is failed and retried
    # set: every trial is a `vllm serve` measured at this load (tuning/serve_study.py), for goodput at `slo`
    # (milliseconds per limit) or, without one, the lowest TPOT p50
    concurrency: int | None = None
    request_rate: float | None = None
    slo: dict[str, float] = field(default_factory=dict)

    def validate(self) -> TuneConfig:
        """Refuse bad input in one line before anything is loaded or any study is touched."""
        if self.load is not None:
            self.check_served()
        validate_knobs(self.workload.knobs)
        check_splittable(len(self.measured_plan.suite.items))
        check_ranges({"--trials": self.trials, "--workers": self.workers, "--holdout": self.holdout,
                      "--timeout": self.timeout, "--heartbeat": self.heartbeat_s})
        if self.objectives not in OBJECTIVES:
            raise SpecbenchError(f"unknown --objectives {self.objectives!r}; known: {' or '.join(OBJECTIVES)}")
        if self.study is not None and not STUDY_NAME.fullmatch(self.study):
            raise SpecbenchError(f"--study {self.study!r}: use letters, digits and . _ + - (it names files too)")
        if len(self.measured_plan.engines) > 1:
            raise SpecbenchError(f"--engine {self.workload.engine}: a study measures one engine; tune with --engine "
                                 f"{' or '.join(ENGINE_NAMES)}")
        if not issubclass(backend(self.measured_plan.engines[0]), Tunable):
            raise SpecbenchError(f"--engine {self.workload.engine}: this engine starts no configuration per trial, "
                                 "so tune cannot measure in it")
        if self.load is None and self.slo:
            raise SpecbenchError("--slo is the objective of a study at a load: give --concurrency N or "
                                 "--request-rate R")
        if len(self.specs()) > self.trials:
            raise SpecbenchError(f"--trials {self.trials} cannot be split between {len(self.specs())} strategies")
        return self

    @functools.cached_property
    def measured_plan(self) -> RunPlan:
        """The workload as a run of the strategies tuned (its knobs and drafters must be for them), planned
        once: the CLI's check, tune's and benchmark.prepare's share it. At a load, vLLM runs it."""
        served = {"engine": "vllm"} if self.load is not None else {}
        return dataclasses.replace(self.workload, strategies=[spec.name for spec in self.specs()], **served).plan()

    def specs(self) -> list[StrategyName]:
        """The strategies to tune, each in its own study; `ar` is refused (it is what they are compared with)."""
        if BASELINE in [s.strip().lower() for s in self.strategies]:
            raise SpecbenchError("strategy ar: the baseline has no knobs to tune; name a drafter or combination")
        return parse_strategies(list(self.strategies) or list(DEFAULT_STRATEGIES))[1:]

    @property
    def load(self) -> Level | None:
        """The load a served study measures at; None: trials are measured one request at a time."""
        if self.concurrency is None and self.request_rate is None:
            return None
        return Level(self.concurrency, self.request_rate)

    def check_served(self) -> None:
        """What a study on servers cannot take: both loads, a GPU profile, another objective, several workers."""
        if self.concurrency is not None and self.request_rate is not None:
            raise SpecbenchError("give one load to tune at: --concurrency N or --request-rate R, not both")
        check_ranges({"--concurrency": self.concurrency, "--request-rate": self.request_rate})
        if self.workload.gpu is not None:
            raise SpecbenchError(f"--gpu {self.workload.gpu}: a study at a load measures real servers here; "
                                 "drop --gpu or the load (--concurrency, --request-rate)")
        if self.objectives != "speedup":
            raise SpecbenchError(f"--objectives {self.objectives}: a study at a load searches for goodput at --slo "
                                 "(or the lowest TPOT without one); drop --objectives")
        if self.workers != 1:
            raise SpecbenchError("--workers: a study at a load starts one server at a time on this machine; drop it")
        if self.workload.engine not in (SPECBENCH, "vllm"):
            raise SpecbenchError(f"--engine {self.workload.engine}: a study at a load runs `vllm serve`; drop "
                                 "--engine")

    @property
    def directions(self) -> tuple[str, ...]:
        if self.load is not None:  # goodput is maximised, the TPOT p50 minimised
            return ("maximize",) if self.slo else ("minimize",)
        return OBJECTIVES[self.objectives]

    def share(self, index: int) -> int:
        """Trials of the index-th strategy's study: the total split evenly, the first ones taking the rest."""
        count = len(self.specs())
        return self.trials // count + (index < self.trials % count)
