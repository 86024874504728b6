"""The typed records a run produces: a `Row` per measured generation, a `StrategySummary` per strategy
(and batch size, engine, category), and the `RunResult` that holds them with what the run noted; and the
record a tune study leaves: a `TunedStudy` (one request at a time) or a `ServedStudy` (at a load).

Measuring produces these; the summary, plots, tables, `--json`, tune and recommend read them. A run
directory (output/run_dir.py) is their sink, and reading one back gives the same records; recommend reads
the tuned studies back. Their dict forms are the files' schema: `as_dict` leaves out the optional entries a
record lacks, as the files always have, so files written before these types read unchanged.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError

if TYPE_CHECKING:
    import pandas as pd


def _plain(value: Any) -> Any:
    """A value read from a frame or parquet as the JSON reader gives it: lists, Python numbers, None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _required(cls) -> list[str]:
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def _as_dict(record) -> dict[str, Any]:
    """A record's dict form: each group of its OPTIONAL entries is left out where the record lacks the first."""
    data = asdict(record)
    absent = {k for first, group in record.OPTIONAL.items() if data[first] is None for k in group}
    return {k: v for k, v in data.items() if k not in absent}


def _from_dict(cls, data: dict[str, Any], where: str):
    """A record from its dict form (a JSON line, a frame's row); keys of no field are not the record's."""
    missing = [k for k in _required(cls) if k not in data]
    if missing:
        raise SpecbenchError(f"{where} lack key(s): {', '.join(missing)}")
    names = {f.name for f in fields(cls)}
    return cls(**{k: _plain(v) for k, v in data.items() if k in names})


def _records(data: dict[str, Any], records: dict[str, type], where: str) -> dict[str, Any]:
    """The entries of `data` that are the dict forms of `records` (key -> record type), as those records."""
    return {k: record.from_dict(data[k], where) for k, record in records.items() if data.get(k) is not None}


def _present(record, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record's dict form: its None entries left out unless named in `keep` (the files leave out the
    optional entries a record lacks), the records it holds in their own dict forms."""
    data = {f.name: getattr(record, f.name) for f in fields(record)}
    return {k: v.as_dict() if hasattr(v, "as_dict") else v for k, v in data.items() if v is not None or k in keep}


class _Record:
    """A record read from its dict form with `from_dict`, whose dict form leaves out its None entries."""

    def as_dict(self) -> dict[str, Any]:
        return _present(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> Self:
        return _from_dict(cls, data, where)


@dataclass
class Row:
    """One measured generation: a strategy on one prompt, turn and repeat at one batch size."""

    # what the summaries read; every run directory has these
    strategy: str
    prompt_id: str
    category: str
    turn: int
    repeat: int
    prompt_tokens: int
    new_tokens: int
    wall_s: float
    steps: int
    drafted: int
    accepted: int
    accept_by_position: list[int]  # [k]: steps that accepted position k + 1
    prefill_s: float
    draft_s: float
    verify_s: float
    other_s: float
    memory_bytes: int
    peak_mem_bytes: int
    mismatch: bool | None  # None when sampling: no greedy check ran
    first_divergence: int | None
    # recorded by every current run; absent from some older directories
    order: int = 0  # the position the strategy ran at among the prompt's strategies
    ttft_s: float | None = None
    tpot_s: float | None = None
    tau: float | None = None
    verified: int | None = None
    max_verified: int | None = None
    draft_depth: int | None = None
    budget: int | None = None
    tree_steps: int | None = None
    drafts: int | None = None  # steps that carried at least one draft token
    stop_reason: str | None = None
    divergence_margin: float | None = None
    output_ids: list[int] = field(default_factory=list)
    batch_size: int = 1
    steps_by_drafted: list[int] | None = None
    engine: str = SPECBENCH
    # batched rows only: the batch's size as decoded, the sequence's own latency, the batch's steps and mean block
    batch_rows: int | None = None
    latency_s: float | None = None
    batch_steps: int | None = None
    batch_block: float | None = None
    # another engine's `ar` only: against specbench's on the same prompt
    engines_agree: bool | None = None
    engines_first_divergence: int | None = None
    engines_divergence_margin: float | None = None
    speedup: float | None = None  # tokens/s over `ar`'s on the same prompt (stats.paired_speedups), once summarised

    OPTIONAL = {"batch_rows": ("batch_rows", "latency_s", "batch_steps", "batch_block"),
                "engines_agree": ("engines_agree", "engines_first_divergence", "engines_divergence_margin"),
                "speedup": ("speedup",)}
    """The entries only some rows have: each group is written where the row has its first."""

    def as_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "a row") -> Row:
        return _from_dict(cls, data, where)


ROW_KEYS = tuple(_required(Row))
"""What every run directory's rows hold (what the summaries read)."""


def rows_frame(rows: list[Row]) -> pd.DataFrame:
    """Rows as one frame, the form the statistics compute on: a column for every field, the ones no row
    has included (empty), so readers never ask which columns a run wrote."""
    import pandas as pd

    return pd.DataFrame([asdict(r) for r in rows], columns=[f.name for f in fields(Row)])


@dataclass
class Projection(_Record):
    """One strategy's measured shape projected onto the --gpu profile (measure/projection.py `project`)."""

    projected: bool
    gpu: str
    verify_s: float
    verify_bound: str  # "memory" or "compute"
    draft_s: float
    overhead_s: float
    step_s: float
    tau: float
    tokens_per_s: float
    ar_tokens_per_s: float
    speedup: float
    memory_fit: dict[str, Any]  # projected, fits, need_gb, have_gb
    by_batch: dict[str, Any] | None = None  # the sweep over batch sizes (`by_batch`); None in runs before it


@dataclass(kw_only=True)  # keyword-only: `rows`, which older runs lack, keeps its place in the files' order
class ModelledSpeedup(_Record):
    """The load axis's model of one strategy at one batch size (measure/batch_model.py `modelled`)."""

    speedup: float
    tokens_per_s: float
    tau: float
    rows: float | None = None  # the mean sequences active per step; None in runs before it
    block: float
    step_s: float
    verify_s: float
    draft_s: float
    overhead_s: float
    ar_step_s: float


@dataclass
class StrategySummary:
    """One strategy's figures over its rows (measure/stats.py says what each is)."""

    strategy: str
    engine: str
    prompts: int
    new_tokens: int
    wall_s: float
    tokens_per_s: float | None
    speedup: float | None
    speedup_ci: list[float | None]
    tau: float | None
    conditional_acceptance_by_position: list[float]
    draft_efficiency: float | None
    mismatches: int | None  # None when sampling: no greedy check ran
    first_divergence: list[int]
    divergence_margin: list[float]
    time_shares: dict[str, float | None]
    memory_bytes: int
    peak_mem_bytes: int
    batch_size: int = 1
    acceptance_rate_by_position: list[float] | None = None  # unconditional, vLLM's; None in runs before it
    category: str | None = None  # set in a summary per category
    engine_agreement: dict[str, Any] | None = None  # another engine's `ar` against specbench's
    cost_model: dict[str, Any] | None = None  # the speedup the cost model predicts, and measured / predicted
    nvml: dict[str, Any] | None = None  # device metrics over the strategy's generations
    host: dict[str, Any] | None = None
    transfer: float | None = None  # this engine's speedup over specbench's for the same strategy
    projection: Projection | None = None  # onto the --gpu profile
    modelled: ModelledSpeedup | None = None  # the load axis's model at this batch size

    RENAMED = {"acceptance_by_position": "conditional_acceptance_by_position"}
    """Old names of fields, as summaries written before the rename hold them."""
    RECORDS = {"projection": Projection, "modelled": ModelledSpeedup}
    """The entries that are records, and the record each is read back as."""

    def as_dict(self) -> dict[str, Any]:
        return _present(self, keep=SUMMARY_KEYS)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "a summary") -> StrategySummary:
        data = {"engine": SPECBENCH, **{cls.RENAMED.get(k, k): v for k, v in data.items()}}
        return _from_dict(cls, {**data, **_records(data, cls.RECORDS, where)}, where)


SUMMARY_KEYS = (*_required(StrategySummary), "batch_size")
"""What every summary holds, None or not (the optional entries are left out where None)."""

SUMMARY_MEANINGS = {
    ("speedup", "speedup_ci"): "per prompt, turn and repeat: the strategy's tokens/s over `ar`'s on the same prompt; "
    "geometric mean over repeats, then over prompts; 95% percentile bootstrap interval over prompts. Per token, so an "
    "earlier EOS (sampling, a mismatch) is not a speedup",
    ("tokens_per_s",): "generated tokens per second of wall time, prefill included",
    ("tau",): "tokens committed per target forward, the bonus token included (`ar`: 1)",
    ("acceptance_rate_by_position",): "drafts whose position k was accepted / drafts: unconditional, the "
    "per-position rate vLLM, AIPerf and `vllm bench serve` report, and the table's acceptance row",
    ("conditional_acceptance_by_position",): "a_k = P(draft k accepted | draft k-1 accepted), over all steps (a step "
    "that drafted nothing is rejected at position 1): what the cost model multiplies",
    ("draft_efficiency",): "accepted draft tokens / drafted tokens, every tree node counted: what a wide tree wastes",
    ("mismatches",): "prompts whose greedy output differs from `ar`'s (must be 0); `null` (shown n/a) when sampling, "
    "where no greedy check runs; `first_divergence` and `divergence_margin` say where and how close the target's "
    "call was",
    ("time_shares",): "prefill, draft, verify, other (acceptance, cache compaction, bookkeeping), summing to 1",
    ("memory_bytes",): "what the strategy needs: target and drafter weights, the target's KV cache at the run's "
    "lengths, the drafter's own state; `peak_mem_bytes` is the process's peak (on a CPU one high-water mark for the "
    "whole run)",
    ("cost_model",): "the speedup predicted from the run's tau and draft shape and from forwards timed separately, "
    "and `measured_over_predicted` ([cost model](docs/cost-model.md))",
    ("engine", "transfer", "engine_agreement"): "which engine decoded it (`specbench`, `vllm`, `transformers`: "
    "[engines](docs/engines.md)); with several engines, each engine's speedup over the first's for the same strategy, "
    "and the prompts whose greedy `ar` output agrees with the first engine's, and where the others part",
}
"""What summary.json's figures mean, declared once: the fields of StrategySummary a row covers -> its meaning
(Markdown, links relative to the repository root). README.md's field table is rendered from it in this order by
scripts/render_readme_fields.py."""


@dataclass(frozen=True)
class Column:
    """A figure as a table column shows it (output/comparison.py), declared once: its header, its legend line
    (with its unit) and how its figure is written."""

    header: str
    legend: str
    form: str = "number"  # "x": a ratio (1.23x); "percent"; "count"; "number": 2 decimals, 1 from 10 on


COLUMN_SPECS = {
    "speedup": Column("speedup [95% CI]", "paired speedup over ar: tokens/s over ar's on the same prompt, "
                      "geometric mean over prompts, 95% bootstrap interval", "x"),
    "transfer": Column("transfer", "the engine's speedup over specbench's for the same strategy (@vllm: measured "
                       "in vLLM, against vLLM's own ar)", "x"),
    "tokens_per_s": Column("tok/s", "generated tokens per second, prefill included"),
    "tau": Column("tau", "tokens per target forward, the bonus token included"),
    "draft_efficiency": Column("eff", "accepted draft tokens / drafted tokens (every tree node)", "percent"),
    "mismatches": Column("mismatch", "prompts whose greedy output differs from ar's (must be 0); n/a when "
                         "sampling: the greedy check does not run", "count"),
    "prompts": Column("prompts", "prompts (and turns) measured", "count"),
    "new_tokens": Column("tokens", "tokens generated", "count"),
    "batch_size": Column("B", "sequences decoded together; the speedup is over batched ar at the same batch size",
                         "count"),
    "share_prefill": Column("prefill", "share of the measured time in prefill", "percent"),
    "share_draft": Column("draft", "... in drafting", "percent"),
    "share_verify": Column("verify", "... in the target's verify forwards", "percent"),
    "share_other": Column("other", "... in acceptance, cache compaction and bookkeeping (the four sum to 100%)",
                          "percent"),
    "memory_gb": Column("needs GB", "memory the strategy needs: target and drafter weights, KV cache at the run's "
                        "lengths, drafter state (GB)"),
    "peak_mem_gb": Column("peak GB", "the process's peak memory (GB; on a CPU one figure for the whole run)"),
    "predicted_speedup": Column("predicted", "cost model's prediction from tau, the draft shape and separately "
                                "timed forwards", "x"),
    "measured_over_predicted": Column("meas/pred", "measured / predicted speedup: below 1 by the engine's "
                                      "overheads", "x"),
    "projected_speedup": Column("projected", "speedup projected onto the --gpu profile (roofline model), not "
                                "measured", "x"),
    "projected_tokens_per_s": Column("proj tok/s", "tokens/s projected onto the --gpu profile, not measured"),
    "projected_fits": Column("fits", "whether weights and KV cache fit the --gpu profile's memory (projected)"),
    "mem_util_pct": Column("mem util %", "NVML memory-controller busy time (%)"),
    "dram_bw_gbs": Column("DRAM GB/s", "DRAM bandwidth through NVML GPM (GB/s)"),
    "energy_j": Column("energy J", "GPU energy over the strategy's generations (J)"),
}
"""Each column a comparison table can show -> how it shows its figure; a column named here is a summary field,
or one the table derives from one (`share_draft` from `time_shares`, `memory_gb` from `memory_bytes`)."""


@dataclass
class EngineReport:
    """What one engine did in a run besides decoding (backends/): its start-up, and what else it reports."""

    engine: str
    start_s: dict[str, float] = field(default_factory=dict)  # strategy -> seconds its engine took to start
    details: dict[str, Any] = field(default_factory=dict)  # the engine's own: vLLM's compile_s, idle engines

    @property
    def empty(self) -> bool:
        return not self.start_s and not self.details

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "an engine report") -> EngineReport:
        return _from_dict(cls, data, where)


@dataclass
class EnginePair:
    """Two engines on the same prompts: whether their greedy `ar` outputs agree token for token, and each
    strategy's transfer (its speedup in `engine` over its speedup in `reference`, at batch size 1)."""

    reference: str
    engine: str
    prompts: int  # greedy `ar` outputs compared: 0 when sampling
    agreeing: int
    first_divergence: list[int]  # where the outputs that part do
    transfer: dict[str, float]

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "an engine pair") -> EnginePair:
        return _from_dict(cls, data, where)


def engine_reports(saved: dict[str, Any], where: str) -> list[EngineReport]:
    """summary.json's engine reports; a run written before engines were plug-ins kept vLLM's two entries."""
    reports = [EngineReport.from_dict(r, where) for r in saved.get("engines", [])]
    legacy = {"idle_engines": saved.get("vllm_idle_engines"), "compile_s": saved.get("vllm_compile_s")}
    if saved.get("vllm_start_s") or any(legacy.values()):
        details = {key: value for key, value in legacy.items() if value}
        reports.append(EngineReport("vllm", dict(saved.get("vllm_start_s") or {}), details))
    return reports


@dataclass
class Noise(_Record):
    """Whether the machine was quiet enough for a run's timings to mean something (measure/noise.py)."""

    noisy: bool
    reasons: list[str]  # why it was noisy
    advice: list[str]
    prompts: int
    others_cpu_share: float  # the share of all CPUs' time other processes took
    steal_share: float  # the share of CPU time a hypervisor stole
    clock_change: float | None  # None where the CPU clock cannot be read
    ar_spread: float | None  # None without repeats of `ar`
    load_before: float | None  # the load average before the run; None where the system has none
    cpus: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # every entry, the None ones too


@dataclass
class RunProjection(_Record):
    """The --gpu profile a run's summaries are projected onto, or the note that it is the GPU measured on."""

    gpu: str
    projected: bool
    note: str | None = None  # why nothing is projected


@dataclass
class LoadAxis(_Record):
    """The load axis (benchmark/modelled_speedup.py): the speedup a cost table models at each of its batch
    sizes beside the measured one, where each strategy stops paying and the best draft length per batch
    size. Or, where it is not modelled, only the note that says why."""

    note: str | None = None
    cost_table: dict[str, str] | None = None  # the key of the cost table it is priced with
    batch_sizes: list[int] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)  # per strategy and batch size: modelled, measured
    stops_paying: dict[str, dict[str, Any]] = field(default_factory=dict)  # per strategy: measured, modelled
    schedule: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per strategy: the best draft caps
    schedule_toml: str = ""  # the schedule as a draft_schedule.toml
    vllm: dict[str, Any] = field(default_factory=dict)  # the schedule in vLLM's form, per strategy it has one

    @property
    def modelled(self) -> bool:
        return self.cost_table is not None

    def as_dict(self) -> dict[str, Any]:
        if not self.modelled:
            return {"note": self.note}
        return {k: v for k, v in asdict(self).items() if k != "note"}


@dataclass
class RunResult:
    """One run: its settings, its rows, the summaries of them and what the run noted."""

    path: Path
    meta: dict[str, Any]  # run.json: status, model, suite, strategies, start and finish
    config: dict[str, Any]  # config.json: the RunConfig measured with
    environment: dict[str, Any]  # environment.json: versions, the machine, the drafters' formats and knobs
    rows: list[Row]
    summary: list[StrategySummary]  # per strategy, engine and batch size
    by_category: list[StrategySummary] = field(default_factory=list)
    skipped_prompts: list[str] = field(default_factory=list)  # longer than the model's context with the answer
    notes: list[str] = field(default_factory=list)  # what the run changed from its configuration
    noise: Noise | None = None
    projection: RunProjection | None = None
    load: LoadAxis | None = None
    engines: list[EngineReport] = field(default_factory=list)  # each engine's report, where it has one
    engine_pairs: list[EnginePair] = field(default_factory=list)  # each pair of engines the run compared
    nvml_series: list[dict[str, Any]] = field(default_factory=list)  # strategy, t_s, metric, value
    label: str = ""  # the name it is shown under (the directory's, unless two runs share one)

    EXTRA = ("skipped_prompts", "notes", "engines", "engine_pairs", "by_category", "noise", "projection", "load")
    """summary.json's entries beside "results"; the empty ones are left out, except the first two."""
    RECORDS = {"noise": Noise, "projection": RunProjection, "load": LoadAxis}
    """The entries that are records, and the record each is read back as."""

    def __post_init__(self) -> None:
        self.label = self.label or self.path.name

    @property
    def complete(self) -> bool:
        return self.meta["status"] == "complete"

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def suite(self) -> str:
        return self.meta["suite"]

    def frame(self) -> pd.DataFrame:
        return rows_frame(self.rows)

    def summary_json(self) -> dict[str, Any]:
        """summary.json: the summaries and what the run noted."""
        lists = {k: [asdict(r) for r in getattr(self, k)] for k in ("engines", "engine_pairs")} | {
            "by_category": [s.as_dict() for s in self.by_category]}
        records = {k: record.as_dict() for k in self.RECORDS if (record := getattr(self, k)) is not None}
        extra = {k: getattr(self, k) for k in self.EXTRA} | lists | records
        return {"results": [s.as_dict() for s in self.summary],
                **{k: v for k, v in extra.items() if v or k in ("skipped_prompts", "notes")}}

    @classmethod
    def noted(cls, saved: dict[str, Any], where: str) -> dict[str, Any]:
        """What summary.json notes beside the summaries and the engines, as a RunResult's fields."""
        return {k: saved[k] for k in ("skipped_prompts", "notes") if k in saved} | _records(saved, cls.RECORDS, where)

    def as_json(self) -> dict[str, Any]:
        """`specbench run --json`: where the run is, and its summary.json."""
        return {"run_dir": str(self.path), "model": self.model, "suite": self.suite, "complete": self.complete,
                **self.summary_json()}


@dataclass(kw_only=True)
class StudyRecord:
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
    trials: dict[str, Any]  # counted, complete, pruned, failed and why (tuning/study_runner.py: trial_counts)
    target_trials: int
    created: str
    best_params: dict[str, Any] | None  # None: no best configuration (the note says why)
    best_value: float | None
    toml: str | None  # the best configuration as a run config
    plots: list[str]
    defaults: dict[str, Any] | None = None  # the defaults' trial: its number, params and value
    note: str | None = None
    best_trial: int | None = None
    knobs: dict[str, dict[str, Any]] | None = None  # the best trial's, as `specbench run` takes them
    controller: str | None = None
    importances: dict[str, float] | None = None
    vllm_config: str | None = None  # the measured speculative config, as `vllm serve` takes it

    BEST = ("best_trial", "knobs", "controller", "importances")
    OPTIONAL = {"defaults": ("defaults",), "note": ("note",), "vllm_config": ("vllm_config",)}
    """The entries only some studies have: each group is written where the study has its first."""

    def as_dict(self) -> dict[str, Any]:
        return _as_dict(self)


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
    tuning: dict[str, Any] | None = None  # the best trial's speedup, its interval and prompts on the tuning prompts
    holdout: dict[str, Any] | None = None  # tuned and defaults on the held-out prompts (tuning/holdout.py)
    gain: dict[str, Any] | None = None  # tuned over defaults, on the held-out and the tuning prompts
    pareto: list[dict[str, Any]] | None = None  # with a memory objective: speedup against memory
    engines: dict[str, Any] | None = None  # the vLLM and SGLang translation of the best knobs, not a measurement
    engines_file: str | None = None
    transformers_config: str | None = None  # the measured arguments of `generate`

    OPTIONAL = {**StudyRecord.OPTIONAL, "best_trial": (*StudyRecord.BEST, "memory_bytes", "tuning", "holdout", "gain"),
                "pareto": ("pareto",), "engines": ("engines", "engines_file"),
                "transformers_config": ("transformers_config",)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "a tuned study") -> TunedStudy:
        return _from_dict(cls, data, where)


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
    baseline: dict[str, Any] | None  # ar's figures at the load
    measured: list[dict[str, Any]]  # every complete trial: number, params, value and figures
    best: dict[str, Any] | None = None  # the best trial's figures, as ar's

    OPTIONAL = {**StudyRecord.OPTIONAL, "best_trial": (*StudyRecord.BEST, "best")}
