"""The records a serve run (serving/) writes and reads back: each request's `RequestRecord`, a level's file
(`LevelFile`: levels/<strategy>/<level>.json), its figures (`LevelFigures`, with `Percentiles`, the server's
`Speculation` and the greedy `Agreement` with `ar`), each level against `ar` (`ServeLevel`), each strategy's
verdicts (`ServeVerdict`) and the run's `ServeResult` (summary.json). serialise.py writes and reads them;
their dict forms are the files' keys, so files written before them read unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.core.records.serialise import Record, read


@dataclass
class RequestRecord(Record):
    """One measured request. Times in seconds: `sent` on the level's clock, the others relative to it."""

    index: int  # the request's position in the level: the same prompt at the same index for every strategy
    prompt_id: str
    sent: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each of those chunks carried (1 for text alone)
    output_tokens: int = 0
    token_ids: list[int] | None = None
    text: str = ""
    error: str | None = None  # any failure leaves the level incomplete: resume measures it again
    http_status: int | None = None  # the status of an answer that was not 200 (401 and 403 stop the run)

    @property
    def itl_per_token(self) -> list[float]:
        """Each chunk's gap spread over the tokens it carried, once per token (SGLang's bench_serving: chunk
        gap / new tokens); empty for a record written before chunks were counted."""
        return [gap / tokens for gap, tokens in zip(self.itl, self.chunk_tokens) for _ in range(tokens)]

    @property
    def tpot(self) -> float | None:
        if self.e2e is None or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

@dataclass
class Percentiles(Record):
    """p50/p90/p99 of a latency in milliseconds (None without values) and `n`, the values they come from."""

    p50: float | None
    p90: float | None
    p99: float | None
    n: int
    more: dict[str, float | None] = field(default_factory=dict)  # --percentiles asked beyond those: "p95" -> ms


@dataclass(kw_only=True)
class Speculation(Record):
    """A server's speculative figures over a level (serving/server_metrics.py): vLLM's counters' differences, or
    SGLang's mean accepted length (its `tau` alone)."""

    source: str  # vllm or sglang
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    tau: float | None  # tokens per drafting step, the bonus token included
    tokens_per_step: float | None = None  # output tokens per forward, as `run` counts tau
    draft_efficiency: float | None = None
    acceptance_by_position: list[float] | None = None

    OPTIONAL = {"drafts": ("drafts", "draft_tokens", "accepted", "tokens_per_step", "draft_efficiency",
                           "acceptance_by_position")}
    """vLLM's counters; SGLang has none of them."""


@dataclass
class Agreement(Record):
    """The lossless check under load (serving/greedy_check.py): a strategy's greedy answers against ar's."""

    compared: int
    mismatches: int
    unit: str  # token, or character where the server streams no token ids
    first_divergence: dict[int, int]  # request index -> where its answer parts from ar's


@dataclass(kw_only=True)
class LevelFile(Record):
    """levels/<strategy>/<level>.json: one strategy's request log at one level, as measured."""

    strategy: str
    level: dict[str, Any]  # the load (serving/serve_config.py `Level`): concurrency, request_rate
    complete: bool  # False: the server failed or died during it; resume measures it again
    duration_s: float
    stopped_by_time: bool
    speculation: Speculation | None
    server: str | None = None  # the server's URL
    counters_missing: str | None = None  # why `speculation` is None where a /metrics scrape around it failed
    records: list[RequestRecord]

    RECORDS = {"speculation": Speculation, "records": [RequestRecord]}


@dataclass(kw_only=True)
class LevelFigures(Record):
    """A level's figures from its request log (serving/level_stats.py `level_summary`); the SLO's three only
    with one."""

    # every level has these; the defaulted ones are absent from the first serve runs' summaries
    requests: int
    errors: int
    error_rate: float | None = None
    duration_s: float
    output_tokens: int
    output_tok_s: float | None
    req_s: float | None
    steady_requests: int = 0  # 0: no steady state, the latencies are every answered request's
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    itl_token_ms: Percentiles | None = None
    e2e_ms: Percentiles
    few_for_p99: bool = False
    tok_s_per_user: float | None
    goodput_req_s: float | None = None
    slo_met: float | None = None
    slo_met_ci: list[float | None] | None = None

    OPTIONAL = {"slo_met_ci": ("goodput_req_s", "slo_met", "slo_met_ci")}
    """Written where the level was measured at an SLO."""
    RECORDS = {k: Percentiles for k in ("ttft_ms", "tpot_ms", "itl_ms", "itl_token_ms", "e2e_ms")}


@dataclass
class Against(Record):
    """A level against ar's at the same level (serving/level_stats.py `against_baseline`), each with its 95%
    interval."""

    tpot_speedup: float | None
    tpot_speedup_ci: list[float | None]
    throughput_ratio: float | None
    throughput_ratio_ci: list[float | None]
    paired_requests: int


@dataclass(kw_only=True)
class LevelKey(Record):
    """Which strategy at which level, and whether it was measured whole."""

    strategy: str
    level: str  # the level's key: c4, r1.5
    concurrency: int | None
    request_rate: float | None
    complete: bool
    stopped_by_time: bool


@dataclass(kw_only=True)
class ServeLevel(LevelFigures, LevelKey):
    """One strategy at one level in summary.json: its figures, the server's speculation and, for a strategy
    beside `ar`, the comparison with ar's level and (greedy) the lossless check."""

    speculation: Speculation | None
    baseline_errors: int | None = None  # ar's failed requests at the level
    tpot_speedup: float | None = None
    tpot_speedup_ci: list[float | None] | None = None
    throughput_ratio: float | None = None
    throughput_ratio_ci: list[float | None] | None = None
    paired_requests: int | None = None
    lossless: Agreement | None = None

    OPTIONAL = {**LevelFigures.OPTIONAL, "paired_requests": ("baseline_errors", "tpot_speedup", "tpot_speedup_ci",
                                                             "throughput_ratio", "throughput_ratio_ci",
                                                             "paired_requests"), "lossless": ("lossless",)}
    """ar's own levels have no comparison; a level is checked for losslessness at temperature 0 only."""
    RECORDS = {**LevelFigures.RECORDS, "speculation": Speculation, "lossless": Agreement}


@dataclass(kw_only=True)
class ServeVerdict(Record):
    """What a strategy's levels decide (serving/sweep.py): where it stops paying, the levels without a verdict
    and, at an SLO, its capacity. `ar` has only the capacity."""

    crossover: float | None = None  # the lowest concurrency where its speedup's interval lies below 1
    errors: dict[str, int] | None = None  # level -> failed requests, its own and ar's: no verdict there
    undecided: list[str] | None = None  # levels whose speedup's interval holds 1
    capacity: int | None = None  # the highest concurrency up to which the SLO share is shown to hold
    slo_share: float | None = None
    capacity_undecided: list[str] | None = None

    OPTIONAL = {"errors": ("crossover", "errors", "undecided"), "slo_share": ("capacity", "slo_share",
                                                                               "capacity_undecided")}


@dataclass
class ServeResult:
    """A serve run summarised: every level against ar's, each strategy's verdicts, and the per-load vLLM
    setting of those shown to pay (schedule.json; None: serve it without speculation). summary.json is
    its `as_json`, each strategy's setting written beside its verdicts."""

    path: Path
    levels: list[ServeLevel]
    strategies: dict[str, ServeVerdict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    complete: bool = True
    slo: dict[str, float] = field(default_factory=dict)  # milliseconds
    schedules: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    incomplete: list[str] = field(default_factory=list)  # "strategy level" of each level not measured completely

    def as_json(self) -> dict[str, Any]:
        strategies = {name: verdict.as_dict() | ({"vllm_speculative_config": self.schedules[name]}
                                                 if name in self.schedules else {})
                      for name, verdict in self.strategies.items()}
        return {"run_dir": str(self.path), "levels": [e.as_dict() for e in self.levels], "strategies": strategies,
                "notes": self.notes, "complete": self.complete, "incomplete": self.incomplete, "slo": self.slo}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> ServeResult:
        """summary.json read back."""
        schedules = {name: figures["vllm_speculative_config"] for name, figures in data["strategies"].items()
                     if "vllm_speculative_config" in figures}
        return cls(Path(data["run_dir"]), read([ServeLevel], data["levels"], where),
                   {name: ServeVerdict.from_dict(v, where) for name, v in data["strategies"].items()},
                   data["notes"], data["complete"], data["slo"], schedules, data.get("incomplete", []))
