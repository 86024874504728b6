"""The records a run produces: a `Row` per measured generation, a `StrategySummary` per strategy (and batch
size, engine, category) with the records it holds, what the run noted (`Noise`, `RunProjection`, `LoadAxis`,
each engine's `EngineReport`, each `EnginePair`), summary.json as a `SummaryFile`, and the `RunResult` that
holds them all.

Measuring produces these; the summary, plots, tables, `--json`, tune and recommend read them. A run directory
(report/run_dir.py) is their sink, and reading one back gives the same records. Their dict forms
(serialise.py) are the files' schema, so files written before these types read unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.core.engine_names import SPECBENCH
from specbench.core.records.serialise import Record, required, to_dict

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Row(Record):
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
    # a prompt flagged as an outlier (bench/remeasure.py) and measured again: `wall_s` and every other figure are the
    # second measurement's, `first_wall_s` the flagged one's; `outlier` says why it was flagged (the engine's log
    # line of a compilation or fallback is kept from the first measurement until then)
    first_wall_s: float | None = None
    outlier: str | None = None

    OPTIONAL = {"batch_rows": ("batch_rows", "latency_s", "batch_steps", "batch_block"),
                "engines_agree": ("engines_agree", "engines_first_divergence", "engines_divergence_margin"),
                "speedup": ("speedup",), "first_wall_s": ("first_wall_s",), "outlier": ("outlier",)}
    """The entries only some rows have: each group is written where the row has its first."""


ROW_KEYS = tuple(required(Row))
"""What every run directory's rows hold (what the summaries read)."""


def rows_frame(rows: list[Row]) -> pd.DataFrame:
    """Rows as one frame, the form the statistics compute on: a column for every field, the ones no row
    has included (empty), so readers never ask which columns a run wrote."""
    import pandas as pd

    return pd.DataFrame([asdict(r) for r in rows], columns=[f.name for f in fields(Row)])


@dataclass
class Projection(Record):
    """One strategy's measured shape projected onto the --gpu profile (analysis/projection.py `project`)."""

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

    OPTIONAL = {"by_batch": ("by_batch",)}


@dataclass(kw_only=True)  # keyword-only: `rows`, which older runs lack, keeps its place in the files' order
class ModelledSpeedup(Record):
    """The load axis's model of one strategy at one batch size (analysis/batch_model.py `modelled`)."""

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

    OPTIONAL = {"rows": ("rows",)}


@dataclass
class CostPrediction(Record):
    """The cost model's step times and speedup for a strategy's measured draft shape (analysis/cost_model.py),
    and how the measured speedup compares."""

    predicted_speedup: float
    draft_s: float  # one step's drafting
    verify_s: float  # one verify forward over `verified` positions
    ar_step_s: float  # one plain decoding step at the same context
    tau: float
    verified: float  # positions per verify forward (drafts + 1)
    budget: float  # the controller's draft budget
    context: float  # positions already in the cache
    tree: bool  # verified with a tree mask
    measured_over_predicted: float | None = None


@dataclass
class EngineAgreement(Record):
    """Another engine's greedy `ar` outputs against specbench's: how many agree token for token, and where and by
    what logit margin the others part."""

    prompts: int
    agreeing: int
    first_divergence: list[int]
    divergence_margin: list[float | None]


@dataclass
class HostFigures(Record):
    """Where there is no NVIDIA GPU: the CPU's utilisation over the strategy's generations and the process's
    peak resident memory."""

    cpu_util_pct: float | None
    peak_rss_bytes: int


@dataclass
class Outlier(Record):
    """A prompt whose first timing was far outside its strategy's others, or during which the engine logged a
    compilation or a fallback, measured again: both timings, and why it was flagged."""

    prompt_id: str
    turn: int
    repeat: int
    first_wall_s: float  # the flagged timing, left out of every figure
    wall_s: float  # the measurement again, which the figures use
    cause: str  # "time" (above median + k * MAD of the strategy's seconds per token) or the engine's log line


@dataclass
class StrategySummary(Record):
    """One strategy's figures over its rows (analysis/stats.py says what each is)."""

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
    engine_agreement: EngineAgreement | None = None  # another engine's `ar` against specbench's
    cost_model: CostPrediction | None = None  # the speedup the cost model predicts, and measured / predicted
    # NVML's figures over the strategy's generations: `<metric>_mean` and `_p95` of each series the GPU reports
    # (analysis/nvml.py), energy, and why a series is unavailable; a mapping, as the series are the device's
    nvml: dict[str, Any] | None = None
    host: HostFigures | None = None
    transfer: float | None = None  # this engine's speedup over specbench's for the same strategy
    projection: Projection | None = None  # onto the --gpu profile
    modelled: ModelledSpeedup | None = None  # the load axis's model at this batch size
    outliers: list[Outlier] | None = None  # its prompts measured again (bench/remeasure.py); None: none was

    OPTIONAL = {k: (k,) for k in ("acceptance_rate_by_position", "category", "engine_agreement", "cost_model", "nvml",
                                  "host", "transfer", "projection", "modelled", "outliers")}
    """The entries left out where None; every other is written, None or not."""
    RENAMED = {"acceptance_by_position": "conditional_acceptance_by_position"}
    """Old names of fields, as summaries written before the rename hold them."""
    DEFAULTS = {"engine": SPECBENCH}  # summaries written before engines were plug-ins were specbench's
    RECORDS = {"projection": Projection, "modelled": ModelledSpeedup, "engine_agreement": EngineAgreement,
               "cost_model": CostPrediction, "host": HostFigures, "outliers": [Outlier]}
    """The entries that are records, and the record each is read back as."""


SUMMARY_KEYS = tuple(f.name for f in fields(StrategySummary) if f.name not in StrategySummary.OPTIONAL)
"""What every summary holds, None or not (the optional entries are left out where None)."""

@dataclass
class EngineReport(Record):
    """What one engine did in a run besides decoding (engines/): its start-up, and what else it reports."""

    engine: str
    start_s: dict[str, float] = field(default_factory=dict)  # strategy -> seconds its engine took to start
    details: dict[str, Any] = field(default_factory=dict)  # the engine's own: vLLM's compile_s, idle engines

    @property
    def empty(self) -> bool:
        return not self.start_s and not self.details


@dataclass
class WarmUp(Record):
    """One strategy's warm-up at one batch size (bench/decode_groups.py `warm_up`): unmeasured passes over the
    batches of the shortest and of the longest prompts measured, repeated for an engine that compiles until the
    last two passes of each came within 10% of each other (pyperf's calibration), at most the run's warmup_cap."""

    strategy: str  # its label: `ngram@vllm`
    batch_size: int
    prompt_tokens: list[int]  # the prompt lengths warmed on: the shortest and the longest measured
    passes: list[int]  # over each batch warmed on
    seconds: float  # the whole warm-up of the strategy at this batch size
    settled: bool | None  # an engine that compiles: whether every batch's last two passes agreed; None: not repeated
    last_s: list[float] = field(default_factory=list)  # each batch's last pass


@dataclass
class EnginePair(Record):
    """Two engines on the same prompts: whether their greedy `ar` outputs agree token for token, and each
    strategy's transfer (its speedup in `engine` over its speedup in `reference`, at batch size 1)."""

    reference: str
    engine: str
    prompts: int  # greedy `ar` outputs compared: 0 when sampling
    agreeing: int
    first_divergence: list[int]  # where the outputs that part do
    transfer: dict[str, float]


@dataclass
class Noise(Record):
    """Whether the machine was quiet enough for a run's timings to mean something (analysis/noise.py)."""

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


@dataclass
class RunProjection(Record):
    """The --gpu profile a run's summaries are projected onto, or the note that it is the GPU measured on."""

    gpu: str
    projected: bool
    note: str | None = None  # why nothing is projected

    OPTIONAL = {"note": ("note",)}


@dataclass(kw_only=True)
class LoadPoint(Record):
    """One strategy at one batch size on the load axis: the speedup the cost table models, and the measured
    one where the run measured that batch size (bench/modelled_speedup.py)."""

    strategy: str
    batch_size: int
    modelled_speedup: float
    measured_speedup: float | None = None
    measured_over_modelled: float | None = None
    modelled_tokens_per_s: float | None = None
    block: float | None = None  # the mean tokens a sequence commits per step, as modelled
    modelled_rows: float | None = None  # the mean sequences active per step, as modelled
    continuous_speedup: float | None = None  # with every sequence active to the end (no batch tail)
    measured_rows: float | None = None  # ... and as measured


@dataclass
class LoadAxis(Record):
    """The load axis (bench/modelled_speedup.py): the speedup a cost table models at each of its batch
    sizes beside the measured one, where each strategy stops paying and the best draft length per batch
    size. Or, where it is not modelled, only the note that says why."""

    note: str | None = None
    cost_table: dict[str, str] | None = None  # the key of the cost table it is priced with
    batch_sizes: list[int] = field(default_factory=list)
    points: list[LoadPoint] = field(default_factory=list)
    stops_paying: dict[str, dict[str, Any]] = field(default_factory=dict)  # per strategy: measured, modelled
    schedule: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per strategy: the best draft caps
    schedule_toml: str = ""  # the schedule as a draft_schedule.toml
    vllm: dict[str, Any] = field(default_factory=dict)  # the schedule in vLLM's form, per strategy it has one

    OPTIONAL = {"note": ("note",), "cost_table": ("cost_table", "batch_sizes", "points", "stops_paying", "schedule",
                                                "schedule_toml", "vllm")}
    """A modelled axis has no note; one not modelled has only its note."""
    RECORDS = {"points": [LoadPoint]}

    @property
    def modelled(self) -> bool:
        return self.cost_table is not None


@dataclass
class SummaryFile(Record):
    """summary.json: a run's summaries and what it noted beside them (docs/summary.schema.json)."""

    results: list[StrategySummary]  # per strategy, engine and batch size
    skipped_prompts: list[str] = field(default_factory=list)  # longer than the model's context with the answer
    notes: list[str] = field(default_factory=list)  # what the run changed from its configuration
    engines: list[EngineReport] = field(default_factory=list)  # each engine's report, where it has one
    engine_pairs: list[EnginePair] = field(default_factory=list)  # each pair of engines the run compared
    by_category: list[StrategySummary] = field(default_factory=list)
    noise: Noise | None = None
    projection: RunProjection | None = None
    load: LoadAxis | None = None
    warmup: list[WarmUp] = field(default_factory=list)  # each strategy's warm-up, per batch size
    # runs written before engines were plug-ins kept vLLM's report in these
    vllm_start_s: dict[str, float] | None = None
    vllm_idle_engines: Any = None  # how the idle engines were kept
    vllm_compile_s: float | None = None

    KEPT = ("results", "skipped_prompts", "notes")
    """The entries written even where empty; the others are left out where empty."""
    RECORDS = {"results": [StrategySummary], "by_category": [StrategySummary], "engines": [EngineReport],
               "engine_pairs": [EnginePair], "noise": Noise, "projection": RunProjection, "load": LoadAxis,
               "warmup": [WarmUp]}
    """The entries that are records, and the record each is read back as."""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in to_dict(self).items() if v or k in self.KEPT}

    def engine_reports(self) -> list[EngineReport]:
        """Each engine's report, vLLM's from the entries of a run written before engines were plug-ins too."""
        legacy = {"idle_engines": self.vllm_idle_engines, "compile_s": self.vllm_compile_s}
        if not self.vllm_start_s and not any(legacy.values()):
            return self.engines
        details = {key: value for key, value in legacy.items() if value}
        return [*self.engines, EngineReport("vllm", dict(self.vllm_start_s or {}), details)]


STATUSES = ("complete", "incomplete")


@dataclass
class NoiseVerdict(Record):
    """What run.json keeps of the noise check: its verdict (the figures are summary.json's `noise`)."""

    noisy: bool
    reasons: list[str]
    advice: list[str]


@dataclass
class RunMeta(Record):
    """run.json: what a run measures, on which model and suite, and whether it finished."""

    status: str  # one of STATUSES: incomplete while measuring, and where it was interrupted or killed
    model: str
    suite: str
    started: str | None  # UTC, ISO 8601 to the second
    finished: str | None  # None until it finishes
    specbench_version: str | None
    strategies: list[str]  # as measured: `ngram`, `ngram@vllm`
    gpu_profile: str | None  # the --gpu profile its summaries are projected onto
    noise: NoiseVerdict | None = None  # written when it finishes

    OPTIONAL = {"noise": ("noise",)}
    DEFAULTS = {"started": None, "finished": None, "specbench_version": None, "gpu_profile": None}
    """Entries run.json files of older versions lack."""
    RECORDS = {"noise": NoiseVerdict}

    @property
    def complete(self) -> bool:
        return self.status == "complete"


@dataclass
class Environment(Record):
    """environment.json: the software and machine a run measured on, and where each strategy's drafters came
    from with the knobs they ran with. Every entry may be absent from an older file."""

    specbench: str | None = None
    git_revision: str | None = None
    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    platform: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    torch_threads: int | None = None
    cuda: str | None = None  # the CUDA device's name; None where the run had none
    drafters: dict[str, dict[str, Any]] = field(default_factory=dict)  # strategy -> member -> format, path, knobs


@dataclass
class RunResult:
    """One run: its settings, its rows, the summaries of them and what the run noted."""

    path: Path
    meta: RunMeta  # run.json
    config: dict[str, Any]  # config.json: the RunConfig measured with
    environment: Environment
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
    warmup: list[WarmUp] = field(default_factory=list)  # each strategy's warm-up, per batch size
    label: str = ""  # the name it is shown under (the directory's, unless two runs share one)

    NOTED = ("skipped_prompts", "notes", "engine_pairs", "noise", "projection", "load", "warmup")
    """What summary.json notes beside the summaries and the engines' reports, as the RunResult holds it."""

    def __post_init__(self) -> None:
        self.label = self.label or self.path.name

    @property
    def complete(self) -> bool:
        return self.meta.complete

    @property
    def model(self) -> str:
        return self.meta.model

    @property
    def suite(self) -> str:
        return self.meta.suite

    def frame(self) -> pd.DataFrame:
        return rows_frame(self.rows)

    def summary_file(self) -> SummaryFile:
        return SummaryFile(self.summary, engines=self.engines, by_category=self.by_category,
                           **{k: getattr(self, k) for k in self.NOTED})

    def summary_json(self) -> dict[str, Any]:
        """summary.json: the summaries and what the run noted."""
        return self.summary_file().as_dict()

    @classmethod
    def noted(cls, saved: SummaryFile) -> dict[str, Any]:
        """What summary.json notes beside the summaries, as a RunResult's fields."""
        return {k: getattr(saved, k) for k in cls.NOTED} | {"engines": saved.engine_reports()}

    def as_json(self) -> dict[str, Any]:
        """`specbench run --json`: where the run is, and its summary.json."""
        return {"run_dir": str(self.path), "model": self.model, "suite": self.suite, "complete": self.complete,
                **self.summary_json()}
