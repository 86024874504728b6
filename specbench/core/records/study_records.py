"""The records a `specbench tune` study leaves (tuning/): a `TunedStudy` of one request at a time, which
`recommend` reads back, or a `ServedStudy` at a load on vLLM servers; both written by serialise.py, whose
`OPTIONAL` groups leave out what a study lacks, so studies written before a field read unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.core.records.serialise import Record


@dataclass
class FailedTrial(Record):
    number: int
    reason: str


@dataclass
class TrialWalls(Record):
    """Mean wall seconds of a complete and of a pruned trial; None where there was none."""

    complete: float | None = None
    pruned: float | None = None


@dataclass
class PruningSaved(Record):
    """What pruning saved: the prompt runs the pruned trials skipped, of all they would have run."""

    prompts_skipped: int = 0
    prompts_of_pruned_trials: int = 0


@dataclass
class TrialCounts(Record):
    """A study's trials by how they ended (tuning/trials.py: trial_counts); all but `counted` may be absent
    from a hand-written or older file."""

    counted: int  # every trial but those that ran out of --trials
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    infeasible: int = 0  # complete, but not fitting the --gpu profile's memory
    wall_s_per_trial: TrialWalls = field(default_factory=TrialWalls)
    pruning: PruningSaved = field(default_factory=PruningSaved)
    failures: list[FailedTrial] = field(default_factory=list)

    RECORDS = {"wall_s_per_trial": TrialWalls, "pruning": PruningSaved, "failures": [FailedTrial]}


@dataclass
class DefaultsTrial(Record):
    """The study's first trial: the method's default knobs, measured as any trial."""

    trial: int
    params: dict[str, Any]
    value: float


@dataclass
class Speedups(Record):
    """A configuration's speedup over ar on a set of prompts: the geometric mean of the per-prompt speedups
    and its 95% bootstrap interval (tuning/holdout.py `interval`)."""

    speedup: float | None
    speedup_ci: list[float | None]
    prompts: int


@dataclass
class Gain(Record):
    """The tuned configuration over the defaults, prompt by prompt (tuning/holdout.py `paired_gain`)."""

    gain: float | None
    gain_ci: list[float | None]
    prompts: int


@dataclass
class Holdout(Record):
    """The tuned configuration and the defaults on the held-out prompts; each absent where none was measured."""

    tuned: Speedups | None = None
    defaults: Speedups | None = None
    failures: list[str] = field(default_factory=list)  # the runs that failed, and why

    OPTIONAL = {"tuned": ("tuned",), "defaults": ("defaults",)}
    RECORDS = {"tuned": Speedups, "defaults": Speedups}


@dataclass
class Gains(Record):
    """Tuned over defaults on the held-out prompts, and on the tuning prompts (None without the defaults' trial)."""

    holdout: Gain
    tuning: Gain | None

    RECORDS = {"holdout": Gain, "tuning": Gain}


@dataclass(kw_only=True)
class StudyRecord(Record):
    """What every `specbench tune` study records of itself and its best trial (tuning/)."""

    study: str
    storage: str  # the Optuna storage's URL, its password hidden
    strategy: str
    model: str
    label: str  # what the objective measures, and where
    suite: str
    categories: list[str]  # empty: every category
    temperature: float
    max_new_tokens: int
    trials: TrialCounts
    target_trials: int
    created: str
    best_params: dict[str, Any] | None  # None: no best configuration (the note says why)
    best_value: float | None
    toml: str | None  # the best configuration as a run config
    plots: list[str]
    defaults: DefaultsTrial | None = None
    note: str | None = None
    best_trial: int | None = None
    knobs: dict[str, dict[str, Any]] | None = None  # the best trial's, as `specbench run` takes them
    controller: str | None = None
    importances: dict[str, float] | None = None
    vllm_config: str | None = None  # the measured speculative config, as `vllm serve` takes it

    BEST = ("best_trial", "knobs", "controller", "importances")
    RECORDS = {"defaults": DefaultsTrial, "trials": TrialCounts}
    OPTIONAL = {"defaults": ("defaults",), "note": ("note",), "vllm_config": ("vllm_config",)}
    """The entries only some studies have: each group is written where the study has its first."""


@dataclass(kw_only=True)
class TunedStudy(StudyRecord):
    """A study of one request at a time (<out>/tuned/<study>.json): what `recommend` reads back."""

    gpu: str | None  # the profile the objective was projected onto; None: measured on its own machine
    projected: bool
    objectives: list[str]
    batch_size: int
    prompts: dict[str, int]  # tuning, holdout
    session: list[str] = field(default_factory=list)  # every strategy its tune was asked for; absent before it was kept
    memory_bytes: float | None = None
    tuning: Speedups | None = None  # the best trial's on the tuning prompts
    holdout: Holdout | None = None
    gain: Gains | None = None
    pareto: list[dict[str, Any]] | None = None  # with a memory objective: speedup against memory
    engines: dict[str, Any] | None = None  # the vLLM and SGLang translation of the best knobs, not a measurement
    engines_file: str | None = None
    transformers_config: str | None = None  # the measured arguments of `generate`

    OPTIONAL = {**StudyRecord.OPTIONAL, "best_trial": (*StudyRecord.BEST, "memory_bytes", "tuning", "holdout", "gain"),
                "pareto": ("pareto",), "engines": ("engines", "engines_file"),
                "transformers_config": ("transformers_config",)}
    RECORDS = {**StudyRecord.RECORDS, "tuning": Speedups, "holdout": Holdout, "gain": Gains}

    def held_out(self, which: str) -> float | None:
        """The held-out speedup of the `tuned` configuration or the `defaults`; None where not measured."""
        figures = getattr(self.holdout, which) if self.holdout else None
        return figures.speedup if figures else None


@dataclass
class ServedFigures(Record):
    """What a study at a load keeps of a level on a server (ar's, or a trial's): the objectives and the
    latencies beside them."""

    goodput_req_s: float | None
    tpot_p50_ms: float | None
    ttft_p50_ms: float | None
    e2e_p50_ms: float | None
    tpot_p99_ms: float | None
    output_tok_s: float | None
    req_s: float | None


@dataclass
class ServedBest(ServedFigures):
    """A trial's figures, with what it gained over ar's at the same load."""

    tpot_speedup: float | None = None  # ar's TPOT over the trial's, paired by prompt
    tau: float | None = None  # tokens per target forward, from the server's speculation counters


@dataclass
class ServedTrial(ServedBest):
    """A complete trial: its knobs, its value and its figures, and the speculative config its server ran."""

    number: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    speculative_config: dict[str, Any] | None = None
    wall_s: float | None = None


@dataclass(kw_only=True)
class ServedStudy(StudyRecord):
    """A study at a load on vLLM servers (<out>/tuned/serve/<study>.json)."""

    engine: str
    objective: str  # goodput_req_s or tpot_p50_ms
    unit: str
    direction: str
    load: dict[str, float | None]  # concurrency, request_rate
    slo: dict[str, float]  # ttft, tpot, e2e -> milliseconds; empty: none
    requests: int
    engine_args: dict[str, Any]
    logs: str  # the servers' logs
    baseline: ServedFigures | None  # ar's figures at the load
    measured: list[ServedTrial]  # every complete trial
    best: ServedBest | None = None  # the best trial's figures

    RECORDS = {**StudyRecord.RECORDS, "baseline": ServedFigures, "measured": [ServedTrial], "best": ServedBest}
    OPTIONAL = {**StudyRecord.OPTIONAL, "best_trial": (*StudyRecord.BEST, "best")}
